// The Locker contract (SPEC "Core: locks") as one parameterised suite, run against every locker: MemoryLock, RedisLock,
// and Redlock once its fixture exists (call lockContract with a factory for it).
import { getEventListeners } from 'node:events';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import {
  LockBusyError,
  LockLostError,
  type Lease,
  type Locker,
  type LockErrorEvent,
  type LockerOptions,
} from '../../packages/core/src/index.js';
import { abortReason, expectInvalid, rejection, until, within } from './helpers.js';

/** One locker under test, plus the means to look at and tamper with its store. */
export interface LockerFixture {
  /** The locker under test, built with the options given to the factory. */
  readonly locker: Locker;
  /**
   * Another locker on the same store, through connections of its own and with the same options (same prefix).
   * A backend without connections (MemoryLock) returns `locker` itself.
   */
  newConnectionLocker(): Locker;
  /**
   * How many callers are waiting for `key` with their wake-up armed, so that a release from now on must wake them
   * (RedisLock: queued and subscribed). Tests poll it instead of sleeping while a waiter gets ready.
   */
  waiting(key: string): Promise<number>;
  /** Deletes the lock on `key` in the store, behind every locker's back (an operator's DEL, a FLUSHALL, data loss). */
  deleteBehindBack(key: string): Promise<void>;
  /** One round trip to the store (RedisLock: an INCR), awaited inside critical sections; absent: a setImmediate. */
  roundTrip?(): Promise<unknown>;
  /** Closes every locker and connection the fixture made. */
  cleanup(): Promise<void>;
}

/** Builds a fresh fixture; `options` go to every locker it makes. Each fixture has its own namespace (prefix). */
export type MakeLocker = (options?: LockerOptions) => Promise<LockerFixture>;

const immediate = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

/** Index of the first element not strictly greater than its predecessor, or -1. */
function firstNonIncreasing(values: readonly number[]): number {
  for (let i = 1; i < values.length; i++) if (!(values[i]! > values[i - 1]!)) return i;
  return -1;
}

/**
 * Registers the contract tests for one locker implementation.
 * @param name - shown in test names, e.g. 'RedisLock'
 * @param makeLocker - builds a fresh fixture (called once per test)
 */
export function lockContract(name: string, makeLocker: MakeLocker): void {
  describe(`${name} keeps the Locker contract`, () => {
    let fx: LockerFixture;
    const extra: LockerFixture[] = [];
    let seq = 0;
    /** A key no other test of this suite uses. */
    const freshKey = (label: string): string => `${label}:${++seq}`;
    /** A second fixture with its own options (onError); cleaned up after the test. */
    const fixtureWith = async (options: LockerOptions): Promise<LockerFixture> => {
      const f = await makeLocker(options);
      extra.push(f);
      return f;
    };

    beforeEach(async () => {
      fx = await makeLocker();
    });
    afterEach(async () => {
      await fx.cleanup();
      await Promise.all(extra.splice(0).map((f) => f.cleanup()));
    });

    describe('leases', () => {
      it('hands out a lease with the key, an unguessable token, a fence and a conservative expiry', async () => {
        const key = freshKey('basic');
        const before = Date.now();
        const lease = await fx.locker.acquire(key, { ttl: 5_000 });
        const after = Date.now();
        expect(lease.key).toBe(key);
        // >= 128 random bits: base64url needs 22 characters for 16 bytes.
        expect(lease.token).toMatch(/^[A-Za-z0-9_-]{22,}$/);
        expect(Number.isSafeInteger(lease.fence)).toBe(true);
        expect(lease.fence).toBeGreaterThan(0);
        // Conservative: never later than the store's expiry, and only drift (<= a few % of the ttl) taken off.
        expect(lease.expiresAt).toBeLessThanOrEqual(after + 5_000);
        expect(lease.expiresAt).toBeGreaterThan(before + 5_000 - 5_000 * 0.05 - 50);
        expect(lease.signal.aborted).toBe(false);

        const other = await fx.locker.acquire(freshKey('basic'));
        expect(other.token).not.toBe(lease.token);

        expect(await lease.release()).toBe(true);
        expect(lease.signal.aborted).toBe(true);
        expect(await lease.release()).toBe(false);
        // Two calls at once: only the one that released it answers true.
        expect(await Promise.all([other.release(), other.release()])).toEqual([true, false]);
      });

      // An extension's expiresAt takes the same drift allowance off as an acquire's: the allowance an acquire of that
      // ttl showed (at least) must show after the extension too. (Without it, a holder would count on up to 1% of the
      // ttl more than the store promised.)
      it('keeps an extended lease as conservative as an acquired one', async () => {
        const TTL = 20_000;
        const before = Date.now();
        const lease = await fx.locker.acquire(freshKey('extend-drift'), { ttl: TTL });
        const after = Date.now();
        // The acquire's allowance lies between these (the lease counts from some instant between before and after).
        const least = before + TTL - lease.expiresAt;
        const most = after + TTL - lease.expiresAt;
        const asked = Date.now();
        await lease.extend(TTL);
        const answered = Date.now();
        // Bounds that hold for any stall of this process (1 ms each for Date.now's rounding); without the allowance
        // after an extension, the upper one fails by the allowance (202 ms on RedisLock).
        expect(lease.expiresAt).toBeGreaterThanOrEqual(asked + TTL - most - 1);
        expect(lease.expiresAt).toBeLessThanOrEqual(answered + TTL - least + 1);
        expect(await lease.release()).toBe(true);
      });

      /** Workers on `lockers` (one each) take `key` `perWorker` times with wait; returns what the checks need. */
      async function contend(lockers: readonly Locker[], perWorker: number, wait: number) {
        const key = freshKey('contended');
        let inside = 0;
        let maxInside = 0;
        const fences: number[] = [];
        let longestWait = 0;
        const started = performance.now();
        await Promise.all(
          lockers.map(async (locker) => {
            for (let i = 0; i < perWorker; i++) {
              const asked = performance.now();
              const lease = await locker.acquire(key, { wait, ttl: 10_000 });
              longestWait = Math.max(longestWait, performance.now() - asked);
              inside++;
              maxInside = Math.max(maxInside, inside);
              fences.push(lease.fence);
              // Yield inside the critical section, so an overlapping holder would get the chance to run.
              await (fx.roundTrip ? fx.roundTrip() : immediate());
              await immediate();
              inside--;
              expect(await lease.release()).toBe(true);
            }
          }),
        );
        return { maxInside, fences, longestWait, elapsed: performance.now() - started };
      }

      it('grants at most one holder at a time to 16 contending connections, fences rising in critical-section order', async () => {
        const WORKERS = 16;
        const PER_WORKER = 64; // 1,024 acquisitions in all
        const WAIT = 20_000;
        const r = await contend(Array.from({ length: WORKERS }, () => fx.newConnectionLocker()), PER_WORKER, WAIT);
        expect(r.maxInside).toBe(1);
        expect(r.fences).toHaveLength(WORKERS * PER_WORKER);
        expect(firstNonIncreasing(r.fences)).toBe(-1);
        expect(r.longestWait).toBeLessThan(WAIT);
        // Hand-offs are driven by wake-ups, not by the 1 s polling fallback.
        expect(r.elapsed).toBeLessThan(15_000);
      });

      it('does the same for 12 workers sharing one locker and 4 on their own connections (hand-offs within a process)', async () => {
        const WAIT = 20_000;
        const lockers = [...Array.from({ length: 12 }, () => fx.locker), ...Array.from({ length: 4 }, () => fx.newConnectionLocker())];
        const r = await contend(lockers, 48, WAIT);
        expect(r.maxInside).toBe(1);
        expect(r.fences).toHaveLength(16 * 48);
        expect(firstNonIncreasing(r.fences)).toBe(-1);
        expect(r.longestWait).toBeLessThan(WAIT);
        expect(r.elapsed).toBeLessThan(15_000);
      });
    });

    describe('stale leases', () => {
      it('an expired lease neither releases nor extends the next holder', async () => {
        const key = freshKey('stale');
        const other = fx.newConnectionLocker();
        const a = await fx.locker.acquire(key, { ttl: 150 });
        const reason = await abortReason(a.signal, 5_000, "A's signal to abort on expiry");
        expect(reason).toBeInstanceOf(LockLostError);

        // A's local expiry is conservative, so the store may need a moment more: B waits for it.
        const b = await other.acquire(key, { ttl: 10_000, wait: 2_000 });
        expect(b.token).not.toBe(a.token);
        expect(b.fence).toBeGreaterThan(a.fence);

        expect(await a.release()).toBe(false);
        const lost = await rejection(a.extend());
        expect(lost).toBeInstanceOf(LockLostError);
        expect(lost).toMatchObject({ code: 'LOCK_LOST', key });

        // B still holds.
        expect(await fx.locker.tryAcquire(key)).toBeNull();
        expect(await other.tryAcquire(key)).toBeNull();
        expect(b.signal.aborted).toBe(false);
        await b.extend(10_000);
        expect(await b.release()).toBe(true);
        expect(await other.tryAcquire(key)).not.toBeNull();
      });

      it('a wall clock stepped an hour either way neither frees a held lock nor ends or stretches its lease', async () => {
        const key = freshKey('clock-step');
        const other = fx.newConnectionLocker();
        const lease = await fx.locker.acquire(key, { ttl: 10_000 });
        const expiresAt = lease.expiresAt;
        const wall = Date.now.bind(Date);
        // NTP, a resumed VM or an operator steps the system clock; lock timing must not follow it.
        for (const step of [3_600_000, -3_600_000]) {
          vi.spyOn(Date, 'now').mockImplementation(() => wall() + step);
          try {
            expect(await other.tryAcquire(key)).toBeNull();
            expect(lease.signal.aborted).toBe(false);
            await lease.extend(10_000);
            // Extended by the real time that passed, not by the step.
            expect(Math.abs(lease.expiresAt - expiresAt)).toBeLessThan(5_000);
          } finally {
            vi.restoreAllMocks();
          }
        }
        expect(await lease.release()).toBe(true);
      });

      it('a lease deleted in the store fails to extend with LockLostError and aborts its signal', async () => {
        const key = freshKey('deleted');
        const lease = await fx.locker.acquire(key, { ttl: 10_000 });
        await fx.deleteBehindBack(key);
        const lost = await rejection(lease.extend());
        expect(lost).toBeInstanceOf(LockLostError);
        expect(lost).toMatchObject({ code: 'LOCK_LOST' });
        expect(lease.signal.aborted).toBe(true);
        expect(lease.signal.reason).toBeInstanceOf(LockLostError);
        expect(await lease.release()).toBe(false);
      });
    });

    describe('busy keys', () => {
      it('tryAcquire resolves null; acquire rejects LockBusyError with the holder’s remaining time', async () => {
        const key = freshKey('busy');
        const other = fx.newConnectionLocker();
        const asked = Date.now();
        const holder = await fx.locker.acquire(key, { ttl: 10_000 });

        expect(await other.tryAcquire(key)).toBeNull();
        expect(await other.tryAcquire(key, { ttl: 10 })).toBeNull();

        const busy = await rejection(other.acquire(key));
        expect(busy).toBeInstanceOf(LockBusyError);
        expect(busy).toMatchObject({ code: 'LOCK_BUSY', key });
        const retryAfter = (busy as LockBusyError).retryAfter;
        expect(retryAfter).toBeDefined();
        expect(retryAfter!).toBeLessThanOrEqual(10_000);
        expect(retryAfter!).toBeGreaterThan(10_000 - (Date.now() - asked) - 100);

        // With a wait, it gives up after about the wait, and no later than the polling step.
        const started = performance.now();
        const late = await rejection(other.acquire(key, { wait: 150 }));
        const waited = performance.now() - started;
        expect(late).toBeInstanceOf(LockBusyError);
        expect(waited).toBeGreaterThanOrEqual(140);
        expect(waited).toBeLessThan(1_000);
        expect(await other.tryAcquire(key, { wait: 50 })).toBeNull();

        expect(await holder.release()).toBe(true);
      });

      it('wakes a waiter promptly when the holder releases, well before the polling fallback', async () => {
        const key = freshKey('wake');
        let holder: Lease = await fx.locker.acquire(key, { ttl: 30_000 });
        // Three hand-offs: each waiter would otherwise sleep up to the 1 s poll (the holder's ttl is far away).
        for (let round = 0; round < 3; round++) {
          const waiterLocker = fx.newConnectionLocker();
          const pending = waiterLocker.acquire(key, { wait: 10_000, ttl: 30_000 });
          pending.catch(() => undefined); // asserted below; keeps an early failure from turning unhandled
          await until(async () => (await fx.waiting(key)) >= 1, 5_000, 'the waiter to queue and listen');
          const releasedAt = performance.now();
          expect(await holder.release()).toBe(true);
          holder = await within(pending, 10_000, 'the waiting acquire');
          expect(performance.now() - releasedAt).toBeLessThan(200);
        }
        expect(await holder.release()).toBe(true);
      });
    });

    describe('reentry from the line', () => {
      it('takes a waiter let in by reentry out of the line, so the waiter behind it gets the freed lock at once', async () => {
        const key = freshKey('reentry-line');
        const x = await fx.locker.acquire(key, { owner: 'x', ttl: 30_000 });
        const [l1, l2, l3] = [fx.newConnectionLocker(), fx.newConnectionLocker(), fx.newConnectionLocker()];
        // Two waiters of one owner queue, then one without an owner behind them.
        const w1 = l1.acquire(key, { owner: 'o', wait: 10_000, ttl: 30_000 });
        await until(async () => (await fx.waiting(key)) >= 1, 5_000, 'the first waiter to queue');
        const w2 = l2.acquire(key, { owner: 'o', wait: 10_000, ttl: 30_000 });
        await until(async () => (await fx.waiting(key)) >= 2, 5_000, 'the second waiter to queue');
        const z = l3.acquire(key, { wait: 10_000, ttl: 30_000 });
        z.catch(() => undefined); // asserted below
        await until(async () => (await fx.waiting(key)) >= 3, 5_000, 'the last waiter to queue');
        expect(await x.release()).toBe(true);
        // The first gets the lock; the second, of the same owner, gets in by reentry at its next attempt.
        const first = await within(w1, 5_000, 'the first waiter');
        const second = await within(w2, 5_000, 'the second waiter, by reentry');
        expect(second.token).toBe(first.token);
        expect(await first.release()).toBe(true);
        const freedAt = performance.now();
        expect(await second.release()).toBe(true);
        // Left in the line, the second waiter's place would come first now and hold the last one up for its poll and
        // the grace after it (about 2 s).
        const last = await within(z, 10_000, 'the last waiter');
        expect(performance.now() - freedAt).toBeLessThan(1_000);
        expect(await last.release()).toBe(true);
      });
    });

    describe('abort signals', () => {
      it('aborting while waiting rejects with the signal’s reason, and the waiter leaves the line', async () => {
        const key = freshKey('abort');
        const holder = await fx.locker.acquire(key, { ttl: 30_000 });
        const other = fx.newConnectionLocker();
        const controller = new AbortController();
        const reason = new Error('caller gave up');
        const pending = other.acquire(key, { wait: 10_000, signal: controller.signal });
        pending.catch(() => undefined);
        await until(async () => (await fx.waiting(key)) >= 1, 5_000, 'the waiter to queue and listen');

        const abortedAt = performance.now();
        controller.abort(reason);
        await expect(pending).rejects.toBe(reason);
        expect(performance.now() - abortedAt).toBeLessThan(200);

        // The abandoned waiter must not stand in the way of the next caller (fair queues hand over to waiters first):
        // not for as long as its place would take to lapse (1.5 s and more). (Once, under a loaded full run, a Redlock
        // tryAcquire right after the release found the key busy: a second of slack for such a moment.)
        expect(await holder.release()).toBe(true);
        let next: Lease | null = null;
        await until(async () => (next = await other.tryAcquire(key)) !== null, 1_000, 'the next caller to get the lock', 20);
        await next!.release();
      });

      it('one signal shared by many waiters: one listener on it, no MaxListenersExceededWarning, every waiter rejected', async () => {
        const key = freshKey('shared-signal');
        const holder = await fx.locker.acquire(key, { ttl: 30_000 });
        const controller = new AbortController();
        const warnings: Error[] = [];
        const onWarning = (w: Error) => warnings.push(w);
        process.on('warning', onWarning);
        try {
          // An app's shutdown signal, passed to every acquire: twenty waiters at once (Node warns past ten listeners).
          const waiting = Array.from({ length: 20 }, () => rejection(fx.locker.acquire(key, { wait: 10_000, signal: controller.signal })));
          await until(async () => (await fx.waiting(key)) >= 1, 5_000, 'the waiters to queue and listen');
          const reason = new Error('shutting down');
          controller.abort(reason);
          for (const outcome of await within(Promise.all(waiting), 2_000, 'the aborted waiters')) expect(outcome).toBe(reason);
          // Node emits the warning on the next turn of the event loop.
          await new Promise((resolve) => setImmediate(resolve));
          expect(warnings.filter((w) => w.name === 'MaxListenersExceededWarning')).toEqual([]);
        } finally {
          process.off('warning', onWarning);
          await holder.release();
        }
      });

      it('leaves no abort listener on the caller’s signal once a call is over (Node keeps such a signal alive)', async () => {
        const key = freshKey('signal-listeners');
        const signal = AbortSignal.any([new AbortController().signal]);
        const lease = await fx.locker.acquire(key, { signal, wait: 1_000 });
        expect(getEventListeners(signal, 'abort')).toHaveLength(0);
        const busy = await rejection(fx.newConnectionLocker().acquire(key, { signal, wait: 100 }));
        expect(busy).toMatchObject({ code: 'LOCK_BUSY' });
        expect(getEventListeners(signal, 'abort')).toHaveLength(0);
        await lease.release();
      });

      it('an already-aborted signal rejects at once with its reason, even on a free key, and takes nothing', async () => {
        const key = freshKey('pre-aborted');
        const reason = new Error('already aborted');
        const signal = AbortSignal.abort(reason);
        await expect(within(fx.locker.acquire(key, { signal }), 100, 'acquire')).rejects.toBe(reason);
        await expect(within(fx.locker.tryAcquire(key, { signal }), 100, 'tryAcquire')).rejects.toBe(reason);
        await expect(fx.locker.acquire(key, { signal, wait: 5_000 })).rejects.toBe(reason);
        let ran = false;
        await expect(
          fx.locker.using(key, async () => {
            ran = true;
          }, { signal }),
        ).rejects.toBe(reason);
        expect(ran).toBe(false);
        // The default reason is the signal's own AbortError.
        const plain = AbortSignal.abort();
        await expect(fx.locker.acquire(key, { signal: plain })).rejects.toBe(plain.reason);

        const lease = await fx.newConnectionLocker().tryAcquire(key);
        expect(lease).not.toBeNull();
        await lease!.release();
      });
    });

    describe('using', () => {
      it('returns fn’s value, and releases in finally when fn throws, propagating fn’s error', async () => {
        const key = freshKey('using');
        const other = fx.newConnectionLocker();
        let seen: Lease | undefined;
        expect(
          await fx.locker.using(key, async (lease) => {
            seen = lease;
            expect(await other.tryAcquire(key)).toBeNull();
            return 42;
          }),
        ).toBe(42);
        expect(seen!.signal.aborted).toBe(true);

        const boom = new Error('boom');
        await expect(
          fx.locker.using(key, async (lease) => {
            seen = lease;
            expect(await other.tryAcquire(key)).toBeNull();
            throw boom;
          }),
        ).rejects.toBe(boom);
        expect(seen!.signal.aborted).toBe(true);
        const after = await other.tryAcquire(key);
        expect(after).not.toBeNull();
        await after!.release();
      });

      it('auto-extends a 300 ms lease through a 1 s function', async () => {
        const events: LockErrorEvent[] = [];
        const f = await fixtureWith({ onError: (e) => events.push(e) });
        const key = freshKey('auto-extend');
        const other = f.newConnectionLocker();
        const started = Date.now();
        let extensions = 0;
        const value = await f.locker.using(
          key,
          async (lease) => {
            const firstExpiry = lease.expiresAt;
            expect(firstExpiry).toBeLessThanOrEqual(started + 300 + 50);
            let last = firstExpiry;
            // Each extension is the event: once it happened, the lock must still be ours in the store.
            while (Date.now() - started < 1_000) {
              await until(() => lease.expiresAt > last || lease.signal.aborted, 1_000, 'an auto-extension');
              expect(lease.signal.aborted).toBe(false);
              last = lease.expiresAt;
              extensions++;
              expect(await other.tryAcquire(key)).toBeNull();
            }
            expect(Date.now()).toBeGreaterThan(firstExpiry + 500);
            return 'done';
          },
          { ttl: 300 },
        );
        expect(value).toBe('done');
        expect(extensions).toBeGreaterThanOrEqual(3);
        expect(events).toEqual([]);
        const after = await other.tryAcquire(key);
        expect(after).not.toBeNull();
        await after!.release();
      });

      it('aborts lease.signal with LockLostError and reports onError "lost" when the lock vanishes from the store', async () => {
        const events: LockErrorEvent[] = [];
        const f = await fixtureWith({ onError: (e) => events.push(e) });
        const key = freshKey('vanished');
        const value = await f.locker.using(
          key,
          async (lease) => {
            await f.deleteBehindBack(key);
            const reason = await abortReason(lease.signal, 3_000);
            expect(reason).toBeInstanceOf(LockLostError);
            expect(reason).toMatchObject({ code: 'LOCK_LOST', key });
            await expect(lease.extend()).rejects.toBeInstanceOf(LockLostError);
            return 'stopped';
          },
          { ttl: 300 },
        );
        expect(value).toBe('stopped');
        expect(events.map((e) => e.operation)).toEqual(['lost']);
        expect(events[0]!.key).toBe(key);
        expect(events[0]!.error).toBeInstanceOf(LockLostError);
        // Someone else can take it now.
        const next = await f.newConnectionLocker().tryAcquire(key);
        expect(next).not.toBeNull();
        await next!.release();
      });

      it('settles once the lock is free: after fn released the lease itself, or lost it by its clock while the store held it', async () => {
        const f = await fixtureWith({ onError: () => undefined });
        const other = f.newConnectionLocker();
        for (const how of ['released by fn', 'lost by its clock'] as const) {
          const key = freshKey('using-free');
          await f.locker.using(
            key,
            async (lease) => {
              // Not awaited: using's own release is the one to wait for.
              if (how === 'released by fn') void lease.release();
              else await abortReason(lease.signal, 3_000, 'the lease to run out');
            },
            { ttl: 400, autoExtend: false },
          );
          const next = await other.tryAcquire(key);
          expect(next, how).not.toBeNull();
          await next!.release();
        }
      });

      it('with autoExtend: false, lets the lease expire while fn runs', async () => {
        const f = await fixtureWith({ onError: () => undefined });
        const key = freshKey('no-extend');
        const other = f.newConnectionLocker();
        await f.locker.using(
          key,
          async (lease) => {
            const reason = await abortReason(lease.signal, 3_000, 'the lease to expire');
            expect(reason).toBeInstanceOf(LockLostError);
            const taken = await other.acquire(key, { wait: 2_000 });
            expect(taken.fence).toBeGreaterThan(lease.fence);
            await taken.release();
          },
          { ttl: 200, autoExtend: false },
        );
      });
    });

    describe('reentrancy', () => {
      it('nests leases of one owner and frees the lock only after every nested lease is released', async () => {
        const key = freshKey('reentrant');
        const other = fx.newConnectionLocker();
        const l1 = await fx.locker.acquire(key, { owner: 'worker-1', ttl: 10_000 });
        const l2 = await fx.locker.acquire(key, { owner: 'worker-1', ttl: 10_000 });
        // The same owner through another connection nests too: the owner is the caller's identity.
        const l3 = await other.acquire(key, { owner: 'worker-1', ttl: 10_000 });
        for (const nested of [l2, l3]) {
          expect(nested.token).toBe(l1.token);
          expect(nested.fence).toBe(l1.fence);
        }

        const blocked = async () => {
          expect(await other.tryAcquire(key, { owner: 'worker-2' })).toBeNull();
          expect(await other.tryAcquire(key)).toBeNull();
        };
        await blocked();

        expect(await l2.release()).toBe(true);
        expect(await l2.release()).toBe(false); // idempotent, and must not drop a second hold
        await blocked();
        expect(await l1.release()).toBe(true);
        await blocked(); // l3 still holds
        expect(await l3.release()).toBe(true);

        const free = await other.tryAcquire(key, { owner: 'worker-2' });
        expect(free).not.toBeNull();
        expect(free!.fence).toBeGreaterThan(l1.fence);
        await free!.release();
      });

      it('ends a nested lease at its own ttl: left unreleased, it does not keep the lock once the others are released', async () => {
        const key = freshKey('nested-ttl');
        const other = fx.newConnectionLocker();
        const outer = await fx.locker.acquire(key, { owner: 'worker-1', ttl: 10_000 });
        const inner = await other.acquire(key, { owner: 'worker-1', ttl: 300 });
        expect(inner.token).toBe(outer.token);
        expect(inner.expiresAt).toBeLessThan(outer.expiresAt - 5_000);
        expect(await abortReason(inner.signal, 5_000)).toBeInstanceOf(LockLostError);
        expect(await other.tryAcquire(key, { owner: 'worker-2' })).toBeNull(); // the outer lease still holds
        // Its hold is over in the store too (a drift allowance, 5 ms here, after the lease's own end; time has to pass,
        // the store tells no one): its release frees nothing and says so, and leaves the outer hold in place.
        await new Promise((resolve) => setTimeout(resolve, 100));
        expect(await inner.release()).toBe(false);
        expect(await other.tryAcquire(key, { owner: 'worker-2' })).toBeNull();
        expect(await outer.release()).toBe(true);
        // Free within the inner hold's own end (a few ms after its lease's, by the store's clock), not the outer's ttl.
        const started = Date.now();
        const next = await other.acquire(key, { owner: 'worker-2', wait: 3_000 });
        expect(Date.now() - started).toBeLessThan(3_000);
        expect(next.fence).toBeGreaterThan(outer.fence);
        await next.release();
      });

      it('ends a hold that is never released with its ttl, though its owner keeps re-entering: another owner gets in meanwhile', async () => {
        const key = freshKey('stuck-hold');
        const other = fx.newConnectionLocker();
        // Its process "crashed": never released, never extended.
        const crashed = await fx.locker.acquire(key, { owner: 'worker-1', ttl: 300 });
        let stop = false;
        let reentries = 0;
        let nested = 0;
        const reentering = (async () => {
          const end = Date.now() + 6_000;
          while (!stop && Date.now() < end) {
            // Waits in line like anyone once another owner is first.
            const lease = await other.acquire(key, { owner: 'worker-1', ttl: 1_000, wait: 6_000 });
            reentries++;
            if (lease.token === crashed.token) nested++;
            await (fx.roundTrip?.() ?? immediate());
            await lease.release();
          }
        })();
        const started = Date.now();
        const next = await fx.locker.acquire(key, { owner: 'worker-2', wait: 4_000 });
        const waited = Date.now() - started;
        stop = true;
        await next.release();
        await within(reentering, 8_000, 'the re-entering loop to stop');
        expect(nested).toBeGreaterThan(0);
        expect(reentries).toBeGreaterThan(nested - 1);
        expect(next.fence).toBeGreaterThan(crashed.fence);
        expect(waited).toBeLessThan(4_000);
      });

      it('wakes a waiter when a nested lease’s release brings the lock’s end forward, rather than let it sleep to the old end', async () => {
        const key = freshKey('sooner');
        const other = fx.newConnectionLocker();
        const outer = await fx.locker.acquire(key, { owner: 'worker-1', ttl: 300 });
        const inner = await fx.locker.acquire(key, { owner: 'worker-1', ttl: 10_000 });
        // Refused with the inner hold's end in view, the waiter sleeps until its poll (1 s; Redlock 250 ms).
        const waiting = other.acquire(key, { wait: 5_000 });
        await until(async () => (await fx.waiting(key)) === 1, 2_000, 'the waiter to get ready');
        expect(await inner.release()).toBe(true);
        const released = Date.now();
        const next = await waiting;
        // In once the outer hold ends (within 300 ms), not at the waiter's poll.
        expect(Date.now() - released).toBeLessThan(650);
        expect(next.fence).toBeGreaterThan(outer.fence);
        await next.release();
      });

      // "Keeps the lock for at least ttl more ms (never shortens it)", with an owner as without: an extension shorter
      // than the time left must not bring the store's expiry forward under a lease that still counts on it.
      it('never shortens a lease by a shorter extend, with an owner as without', async () => {
        const other = fx.newConnectionLocker();
        for (const owner of [undefined, 'worker-1']) {
          const key = freshKey(`no-shorten-${owner ?? 'none'}`);
          const lease = await fx.locker.acquire(key, { ttl: 10_000, ...(owner === undefined ? {} : { owner }) });
          const expiresAt = lease.expiresAt;
          await lease.extend(200);
          expect(lease.expiresAt).toBeGreaterThanOrEqual(expiresAt);
          // Time has to pass here: past the shorter extension's end, the lock must still be held.
          await new Promise((resolve) => setTimeout(resolve, 600));
          expect(lease.signal.aborted).toBe(false);
          expect(await other.tryAcquire(key, { owner: 'worker-2' })).toBeNull();
          expect(await lease.release()).toBe(true);
        }
      });

      it('re-enters for exactly the same owner, whatever the owner contains', async () => {
        // Owners that look like the lock's own record, separators, escapes, and lone surrogates (which a UTF-8 encoder
        // would turn into the same U+FFFD): each must re-enter only as itself.
        const owners = ['a 1 1 0 b', ' ', 'x ', '\n', '\0', 'line\r\nbreak', '%', '%25', '%ud800', '\uD800', '\uDBFF', '\uFFFD', 'x\uD800y', '\uD83D\uDE00', 'o'.repeat(100_000)];
        const other = fx.newConnectionLocker();
        for (const [i, owner] of owners.entries()) {
          const key = freshKey(`owner-${i}`);
          const first = await fx.locker.acquire(key, { owner, ttl: 10_000 });
          for (const stranger of owners) {
            if (stranger !== owner) expect(await other.tryAcquire(key, { owner: stranger }), JSON.stringify([owner, stranger].map((o) => o.slice(0, 12)))).toBeNull();
          }
          const nested = await other.acquire(key, { owner, ttl: 10_000 });
          expect(nested.fence).toBe(first.fence);
          expect(await nested.release()).toBe(true);
          expect(await other.tryAcquire(key, { owner: 'someone else' })).toBeNull();
          expect(await first.release()).toBe(true);
          const free = await other.tryAcquire(key);
          expect(free).not.toBeNull();
          await free!.release();
        }
      });
    });

    describe('fences', () => {
      it('grow strictly across release and reacquire, across connections, and after expiry', async () => {
        const key = freshKey('fence');
        const lockers = [fx.locker, fx.newConnectionLocker(), fx.newConnectionLocker()];
        const fences: number[] = [];
        for (let i = 0; i < 12; i++) {
          const lease = await lockers[i % lockers.length]!.acquire(key, { ttl: 5_000 });
          fences.push(lease.fence);
          await lease.release();
        }
        const expiring = await lockers[0]!.acquire(key, { ttl: 100 });
        fences.push(expiring.fence);
        await abortReason(expiring.signal, 3_000, 'the lease to expire');
        const after = await lockers[1]!.acquire(key, { ttl: 5_000, wait: 2_000 });
        fences.push(after.fence);
        await after.release();
        expect(firstNonIncreasing(fences)).toBe(-1);
      });
    });

    describe('keys', () => {
      const MB = 1 << 20;
      const tricky = [
        '{',
        '}',
        '{}',
        'a{b}c',
        '%',
        '%7D',
        '%7d',
        '%25',
        '%ud800',
        'a',
        'a}',
        'a}:f', // shaped like the internal suffixes of key 'a'
        'a}:q',
        'a}:w',
        'a}:d',
        'a:f',
        'a\0b',
        'a\0c',
        '\0',
        'line\nbreak',
        'line\r\nbreak',
        '\uD800', // lone surrogates: ioredis would turn each into U+FFFD if sent as is
        '\uDBFF',
        '\uDC00',
        '\uFFFD',
        'x\uD800y',
        '\uD83D\uDE00', // a valid pair
        ' ',
        'k'.repeat(MB),
        `${'k'.repeat(MB - 1)}}`,
      ];

      it('takes any string as a key, and distinct keys never collide', async () => {
        const other = fx.newConnectionLocker();
        const held: Lease[] = [];
        for (const key of tricky) {
          const lease = await fx.locker.tryAcquire(key, { ttl: 10_000 });
          expect(lease, `key ${JSON.stringify(key.slice(0, 20))} is free`).not.toBeNull();
          expect(lease!.key).toBe(key);
          held.push(lease!);
        }
        for (const key of tricky) {
          expect(await other.tryAcquire(key), `key ${JSON.stringify(key.slice(0, 20))} is held`).toBeNull();
        }
        for (const lease of held) expect(await lease.release()).toBe(true);
        // Fences of 'a' still grow after activity on keys shaped like its internal names.
        const a = await other.acquire('a');
        expect(a.fence).toBeGreaterThan(held[tricky.indexOf('a')]!.fence);
        await a.release();
      });

      it('rejects an empty or non-string key with an error naming key', async () => {
        await expectInvalid(() => fx.locker.acquire(''), 'key');
        await expectInvalid(() => fx.locker.tryAcquire(''), 'key');
        await expectInvalid(() => fx.locker.using('', async () => undefined), 'key');
        await expectInvalid(() => fx.locker.acquire(5 as unknown as string), 'key');
        await expectInvalid(() => fx.locker.acquire(undefined as unknown as string), 'key');
      });
    });
  });
}
