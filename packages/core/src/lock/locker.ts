// The behaviour every locker shares: option resolution, the acquire/wait loop with wake-ups, `using` with
// auto-extension. Backends only supply a LockStore.
import { asLockError, LockBusyError, LockLostError, grantTooLate } from '../errors.js';
import type { AcquireOptions, Lease, Locker, LockErrorEvent, LockerOptions, UsingOptions } from '../types.js';
import { randomToken } from '../util/token.js';
import { LONG_KEY_CHARS } from '../redis/keys.js';
import { ignoreRejection, watchAbort } from '../util/abort.js';
import { realClearTimeout, realPerfNow, realSetTimeout } from '../util/real-timers.js';
import * as v from '../util/validate.js';
import { LeaseImpl, type LeaseTies } from './lease.js';
import { MAX_POLL_MS } from './scripts.lua.js';
import type { AttemptResult, Grant, LockStore } from './store.js';

/** Locker defaults from the contract. */
export const LOCKER_DEFAULTS = { ttl: 30_000, wait: 0 } as const;

// Poll interval when wake-ups are not available (subscriber down), or not confirmed yet.
const FALLBACK_POLL_MS = 50;
// How long a waiter waits for its subscription to wake-ups before it goes on attempting (by polling, as above)
// meanwhile: a subscription is one round trip, but one to a frozen node (on a Cluster, the subscriber's node may be any
// node, replicas included) would otherwise hold every attempt up until it times out, past the caller's `wait`.
const SUBSCRIBE_WAIT_MS = FALLBACK_POLL_MS;
// How long after a wait on a key a new waiter on it listens before its first attempt (wake-up channels linger a while
// after their last listener, so this costs no round trip), and how many such keys a locker remembers.
const RECENT_WAIT_MS = 1_000;
const RECENT_WAIT_KEYS = 1_024;

export interface ResolvedLockerOptions {
  ttl: number;
  wait: number;
  onError: ((event: LockErrorEvent) => void) | undefined;
}

/** Validates the options every locker shares. */
export function resolveLockerOptions(options: LockerOptions): ResolvedLockerOptions {
  const o = v.withDefaults(LOCKER_DEFAULTS, options);
  return {
    ttl: v.duration('ttl', o.ttl),
    wait: v.duration('wait', o.wait, true),
    onError: o.onError === undefined ? undefined : v.func<(e: LockErrorEvent) => void>('onError', o.onError),
  };
}

// What an attempt raced against a hand-over in this process resolves to when the hand-over came first.
const HANDED = Symbol('handed');
// ... and against the caller's signal, when that aborted first.
const ABORTED = Symbol('aborted');
// A subscription to wake-ups not confirmed within SUBSCRIBE_WAIT_MS.
const NOT_YET = Symbol('not yet');

interface CallOptions {
  ttl: number;
  wait: number;
  owner: string;
  signal: AbortSignal | undefined;
}

/** `ttl`, if a lease of that length would outlast the clock-drift allowance; a RangeError naming `ttl` otherwise. */
function usableTtl(store: LockStore, ttl: number): number {
  const drift = store.drift(ttl);
  if (ttl <= drift) {
    throw new RangeError(
      `ttl must be longer than the ${drift} ms allowed for clock drift (a lease would end as it began), got ${ttl}`,
    );
  }
  return ttl;
}

// The store of each locker this copy of the module made, for checks made elsewhere before any call (see checkTtl).
const STORES = new WeakMap<object, LockStore>();

/**
 * For the middleware, at construction: throws the RangeError naming `ttl` that `locker`'s calls would throw for each
 * request, when a lease of `ttl` would not outlast its clock-drift allowance. A locker of another module copy (or
 * another kind) is not checked here; its calls still are.
 */
export function checkTtl(locker: object, ttl: number): void {
  const store = STORES.get(locker);
  if (store !== undefined) usableTtl(store, ttl);
}

// Where a locker keeps its default wait for the middleware. Under a Symbol.for, so that a locker of the other module
// copy (an app that both imports and requires core) tells it too.
const DEFAULT_WAIT = Symbol.for('hasp.locker.defaultWait');

/**
 * For the middleware: the wait `locker`'s calls use when given none (its `wait` option), or `undefined` for a locker
 * hasp did not make (a user's own `Locker`), whose calls may wait without saying so.
 */
export function defaultWait(locker: object): number | undefined {
  const wait = (locker as { [DEFAULT_WAIT]?: unknown })[DEFAULT_WAIT];
  return typeof wait === 'number' ? wait : undefined;
}

/** Adds `by` to `token`'s count in `counts`, dropping it at 0. */
function count(counts: Map<string, number>, token: string, by: number): void {
  const n = (counts.get(token) ?? 0) + by;
  if (n > 0) counts.set(token, n);
  else counts.delete(token);
}

/** Resolves once `promise` settles (it never rejects) or `ms` ms have passed, whichever comes first. */
function settledWithin(promise: Promise<void>, ms: number): Promise<void> {
  if (ms <= 0) return Promise.resolve();
  if (ms === Infinity) return promise;
  // By the real clock, not the timer alone: a timer counts from the event loop's cached time, which lags the clock by
  // however long the current turn has run (ms on a busy process); and 1 ms more, as Redis lets a key go only once its
  // ms clock is past the key's end. (The real clock, not the store's: a fake or injected one may never move.)
  const until = realPerfNow() + ms + 1;
  return new Promise((resolve) => {
    let timer: NodeJS.Timeout;
    const arm = (): void => {
      timer = realSetTimeout(() => (realPerfNow() < until ? arm() : resolve()), Math.ceil(until - realPerfNow()));
    };
    arm();
    void promise.then(() => {
      realClearTimeout(timer);
      resolve();
    });
  });
}

const CALL_OPTIONS = ['ttl', 'wait', 'owner', 'signal'];

/** Shared Locker implementation over a {@link LockStore}. */
export abstract class BaseLocker implements Locker {
  protected readonly defaults: ResolvedLockerOptions;
  // Keys this locker waited on lately, with when.
  private readonly recentWaits = new Map<string, number>();
  // Leases handed out and not ended yet, by token (more than one: nested leases of one owner).
  private readonly liveLeases = new Map<string, number>();
  // Leases a release in this process handed the lock to and not ended yet, by token: the store must not give back what
  // their waiters' own acquires took (see LockStore.watchLeases).
  private readonly handedLeases = new Map<string, number>();

  protected constructor(
    protected readonly store: LockStore,
    defaults: ResolvedLockerOptions,
  ) {
    this.defaults = defaults;
    usableTtl(store, defaults.ttl);
    STORES.set(this, store);
    Object.defineProperty(this, DEFAULT_WAIT, { value: defaults.wait });
    store.watchLeases?.((token) => this.handedLeases.has(token));
  }

  async acquire(key: string, options?: AcquireOptions): Promise<Lease> {
    return this.acquireWith(key, this.callOptions('acquire', key, options));
  }

  async tryAcquire(key: string, options?: AcquireOptions): Promise<Lease | null> {
    const o = this.callOptions('tryAcquire', key, options);
    const result = await this.attemptUntil(key, o);
    return result instanceof LeaseImpl ? result : null;
  }

  async using<T>(key: string, fn: (lease: Lease) => Promise<T>, options?: UsingOptions): Promise<T> {
    v.func('fn', fn);
    const o = this.callOptions('using', key, options);
    const given = v.definedOnly(options);
    const autoExtend = given.autoExtend === undefined ? true : v.boolean('autoExtend', given.autoExtend);
    const lease = await this.acquireWith(key, o);
    if (autoExtend) lease.startAutoExtend();
    try {
      return await fn(lease);
    } finally {
      const lost = lease.lost;
      const released = lease.release().then(
        () => undefined,
        (error: unknown) => {
          // Never mask the function's own outcome with a release failure; the lock expires by its ttl anyway.
          const err = asLockError('release', key, error);
          this.reportError({ operation: 'release', key, error: err });
        },
      );
      // Awaited, so that the lock is free when `using` settles; for a lease lost meanwhile, only for as long as the
      // store may still hold its key by what it answered (LeaseImpl.storeMayHoldFor): past that the ttl has freed it,
      // and waiting on the release (up to `timeout` with Redis frozen) would only hold fn's outcome back.
      if (!lost) await released;
      else await settledWithin(released, lease.storeMayHoldFor());
    }
  }

  /** Stops background work and closes connections this locker opened. The user's Redis clients stay open. */
  close(): void {
    this.store.close();
  }

  private async acquireWith(key: string, o: CallOptions): Promise<LeaseImpl> {
    const result = await this.attemptUntil(key, o);
    if (result instanceof LeaseImpl) return result;
    throw new LockBusyError(key, result.pttl >= 0 ? result.pttl : undefined);
  }

  private callOptions(where: 'acquire' | 'tryAcquire' | 'using', key: string, options: UsingOptions | undefined): CallOptions {
    v.key(key);
    const o = v.definedOnly(options);
    // A misspelt option (`ttll`, `autoextend`) would otherwise be ignored without a word. A loop rather than
    // knownKeys's array search: this runs for every acquire.
    for (const k in o) {
      if (k !== 'ttl' && k !== 'wait' && k !== 'owner' && k !== 'signal' && (k !== 'autoExtend' || where !== 'using')) {
        const known = where === 'using' ? [...CALL_OPTIONS, 'autoExtend'] : CALL_OPTIONS;
        throw v.unknownOption(where, k, known);
      }
    }
    return {
      ttl: o.ttl === undefined ? this.defaults.ttl : usableTtl(this.store, v.duration('ttl', o.ttl)),
      wait: o.wait === undefined ? this.defaults.wait : v.duration('wait', o.wait, true),
      owner: o.owner === undefined ? '' : v.string('owner', o.owner, false),
      signal: o.signal === undefined ? undefined : v.signal('signal', o.signal),
    };
  }

  /** Attempts until granted or `wait` runs out; resolves the lease, or the last busy answer. */
  private async attemptUntil(key: string, o: CallOptions): Promise<LeaseImpl | { pttl: number }> {
    o.signal?.throwIfAborted();
    const token = randomToken();
    // A MemoryLock's injected clock that gives no time now: refused here, where the caller hears it.
    const badClock = this.store.clockError?.();
    if (badClock !== undefined) throw badClock;
    const deadline = this.store.now() + o.wait;
    let stopListening: (() => void) | undefined;
    let listening = false;
    let wake: (() => void) | undefined;
    // Set by a wake-up that arrives while no sleep is pending, so it is not lost.
    let woken = false;
    // Waiters queue for the lock (fair hand-off); whoever leaves without it must leave the line too.
    const queue = o.wait > 0;
    let acquired = false;
    // Let in by reentry (a lease of our owner holds the key): granted under that lease's token, not ours.
    let reentered = false;
    // The store failed, or the caller's signal aborted: the line is left without waiting for the store's answer.
    let storeFailed = false;
    let abandoned = false;
    // A lock a release in this process handed straight to us (see LockStore.waitHere), and how to stop waiting there.
    let handed: { grant: Grant; since: number } | undefined;
    let endWaitHere: ((acquired: boolean) => void) | undefined;
    const onWake = (next: string) => {
      // A release names the waiter it is handed to; the others keep sleeping.
      if (next !== '' && next !== token) return;
      woken = true;
      wake?.();
    };
    // An abort settles the call at once, also while an attempt is on its way (Redis slow or frozen); a grant that comes
    // after it is handed back.
    let stopAbortWatch: (() => void) | undefined;
    // The sleep in progress, ended by the same watch when the signal aborts.
    let abortSleep: (() => void) | undefined;
    // Ends the attempt in progress early, on a hand-over or an abort. One promise per attempt, settled by whichever comes
    // first, rather than a Promise.race against the call's long-lived hand-over and abort promises: each race leaves a
    // reaction on those (pending until the call ends), so a long wait polling every 50 ms kept one per attempt.
    let interrupt: ((why: typeof HANDED | typeof ABORTED) => void) | undefined;
    const abortSignal =
      o.signal === undefined
        ? undefined
        : new Promise<typeof ABORTED>((resolve) => {
            stopAbortWatch = watchAbort(o.signal!, () => {
              resolve(ABORTED);
              interrupt?.(ABORTED);
              abortSleep?.();
            });
          });
    // What an aborted call throws: the signal's reason, once a lock handed to it meanwhile is given back. (Made only
    // for a call with a signal: every acquire would pay for the closure.)
    const abandon =
      o.signal === undefined
        ? undefined
        : (): unknown => {
            abandoned = true;
            if (handed !== undefined) this.handBack(key, handed.grant);
            return o.signal!.reason;
          };
    // Subscribes to the key's wake-ups; once the subscription is confirmed, the waiter sleeps longer between attempts
    // (its stop function is in stopListening), and a sleep in progress ends for another attempt, since a release
    // before the subscription was not heard. A subscription that comes after the call ended is stopped. Unavailable
    // wake-ups (undefined) leave the waiter polling, without trying to listen again.
    let ended = false;
    const listen = (): Promise<(() => void) | undefined> => {
      const subscribing = this.store.listen(key, onWake).then(
        (stop) => stop,
        () => undefined,
      );
      void subscribing.then((stop) => {
        if (ended) stop?.();
        else if (stop !== undefined) {
          stopListening = stop;
          woken = true;
          wake?.();
        }
      });
      return subscribing;
    };
    // Waits for a subscription for at most SUBSCRIBE_WAIT_MS (and the time left), or until the signal aborts.
    const subscribed = async (
      subscribing: Promise<(() => void) | undefined>,
      left: number,
    ): Promise<(() => void) | undefined | typeof NOT_YET | typeof ABORTED> => {
      let timer: NodeJS.Timeout | undefined;
      const notYet = new Promise<typeof NOT_YET>((resolve) => {
        timer = setTimeout(() => resolve(NOT_YET), Math.max(0, Math.min(left, SUBSCRIBE_WAIT_MS)));
      });
      const first = await Promise.race([subscribing, notYet, ...(abortSignal ? [abortSignal] : [])]);
      clearTimeout(timer);
      return first;
    };
    try {
      if (queue && this.waitedLately(key)) {
        // A hot key: listen first, so a refused attempt can sleep at once. The usual order (attempt, listen, attempt
        // again) needs the second attempt because a release between the first and the subscription would be missed.
        listening = true;
        if ((await subscribed(listen(), o.wait)) === ABORTED) throw abandon!();
      }
      for (;;) {
        if (o.signal?.aborted) throw abandon!();
        if (handed !== undefined) {
          const { grant, since } = handed;
          const lease = this.leaseIfLive(key, grant, since, o, true);
          if (lease !== undefined) {
            acquired = true;
            return lease;
          }
          // Out of this process's line now (the hand-over took us out): wait in Redis's line, and join this one again
          // when refused.
          handed = undefined;
          endWaitHere?.(false);
          endWaitHere = undefined;
          if (deadline - this.store.now() <= 0) throw grantTooLate(key, this.store.now() - since, o.ttl, this.store.drift(o.ttl));
          continue;
        }
        woken = false;
        const started = this.store.now();
        let result: AttemptResult | typeof HANDED | typeof ABORTED;
        const attempt = this.store.attempt(key, token, o.owner, o.ttl, queue);
        try {
          // Registered in this process's line: a release here may let us in while this attempt is on its way (say,
          // with Redis slow to answer). Take the lock then; the attempt's reply, or its failure, no longer matters.
          result = await (endWaitHere === undefined && abortSignal === undefined
            ? attempt
            : new Promise<AttemptResult | typeof HANDED | typeof ABORTED>((resolve, reject) => {
                interrupt = resolve;
                attempt.then(resolve, reject);
              }));
          interrupt = undefined;
        } catch (error) {
          interrupt = undefined;
          if (o.signal?.aborted) throw abandon!();
          if (handed !== undefined) continue;
          storeFailed = true;
          throw error;
        }
        if (result === ABORTED || o.signal?.aborted) {
          // The abandoned attempt goes on (Redlock retries its rounds, each putting this waiter back in the line):
          // once it settles, a grant is given back, and otherwise the line is left again after its last round.
          if (result === ABORTED) {
            const after = (late: AttemptResult | undefined) => {
              if (late?.ok) this.handBack(key, late);
              // A grant by reentry leaves the waiter in the line too (see `reentered`).
              if (queue && (!late?.ok || late.nested === true)) this.store.leave(key, token).catch(() => undefined);
            };
            attempt.then(after, () => after(undefined));
          } else if (result !== HANDED && result.ok) this.handBack(key, result);
          throw abandon!();
        }
        if (result === HANDED) continue;
        if (result.ok) {
          const lease = this.leaseIfLive(key, result, started, o);
          if (lease !== undefined) {
            acquired = true;
            reentered = result.nested === true;
            return lease;
          }
          // Granted too late to be of use (Redis was slow, or Redlock needed retries): the time left in `wait` may
          // still get a lease that is.
          if (deadline - this.store.now() <= 0) throw grantTooLate(key, this.store.now() - started, o.ttl, this.store.drift(o.ttl));
          continue;
        }
        if (handed !== undefined) continue;
        if (queue && endWaitHere === undefined && this.store.waitHere !== undefined) {
          // We are in the line now: a release in this process may hand us the lock directly.
          endWaitHere = this.store.waitHere(key, token, o.owner, o.ttl, (grant, since) => {
            handed = { grant, since };
            woken = true;
            interrupt?.(HANDED);
            wake?.();
          });
        }
        let left = deadline - this.store.now();
        if (left <= 0) return result;
        if (o.signal?.aborted) throw abandon!();
        if (!listening) {
          // Subscribe, then try again at once: a release between our attempt and the subscription is not missed. (A
          // subscription still on its way goes on: its confirmation ends the sleep below for that attempt.)
          listening = true;
          this.noteWait(key);
          const first = await subscribed(listen(), left);
          if (first === ABORTED) throw abandon!();
          // Subscribed: no release can be missed from here. Not yet: the wait for it was a poll's length; attempt
          // again, as after a poll (its confirmation, later, wakes a sleep for another attempt).
          if (first !== undefined) continue;
          left = deadline - this.store.now();
          if (left <= 0) return result;
        }
        if (woken) continue;
        // (An abort between the last check and here would otherwise wait out the sleep: abortSleep is set only below.)
        if (o.signal?.aborted) throw abandon!();
        const poll = stopListening ? (this.store.pollMs ?? MAX_POLL_MS) : FALLBACK_POLL_MS;
        // A holder's expiry publishes nothing, so never sleep past it.
        const until = Math.min(left, poll, result.pttl >= 0 ? result.pttl + 1 : poll);
        await new Promise<void>((resolve, reject) => {
          const done = () => {
            clearTimeout(timer);
            abortSleep = undefined;
            wake = undefined;
          };
          const timer = setTimeout(() => {
            done();
            resolve();
          }, until);
          wake = () => {
            done();
            resolve();
          };
          if (abortSignal !== undefined) {
            abortSleep = () => {
              done();
              reject(abandon!());
            };
          }
        });
      }
    } finally {
      ended = true;
      stopAbortWatch?.();
      endWaitHere?.(acquired);
      stopListening?.();
      if (queue && !acquired) {
        const leaving = this.store.leave(key, token).catch(() => undefined);
        // Settle only once out of the line: a release right after our LockBusyError would otherwise hand the lock to
        // us (a departed waiter) and refuse everyone else until the leave lands, which after a SCRIPT FLUSH (NOSCRIPT,
        // then EVAL) comes after whatever the caller sends next. When the store itself just failed, the leave would
        // only add its own timeout to the error; an abort must settle at once.
        if (!storeFailed && !abandoned) await leaving;
      } else if (queue && reentered) {
        // A waiter let in by reentry is still in the line under its own token (the grant did not take it out): left
        // there, it would be first once the lock is free, and hold up the next waiter until its place lapses. Sent now,
        // so it goes out ahead of this lease's release; nobody needs to wait for it.
        this.store.leave(key, token).catch(() => undefined);
      }
    }
  }

  private waitedLately(key: string): boolean {
    const at = this.recentWaits.get(key);
    if (at === undefined) return false;
    if (this.store.now() - at < RECENT_WAIT_MS) {
      this.recentWaits.set(key, this.store.now());
      return true;
    }
    this.recentWaits.delete(key);
    return false;
  }

  private noteWait(key: string): void {
    // A long key (a client's) is not remembered: a thousand of them could hold megabytes.
    if (key.length > LONG_KEY_CHARS) return;
    if (this.recentWaits.size >= RECENT_WAIT_KEYS) this.recentWaits.clear();
    this.recentWaits.set(key, this.store.now());
  }

  /**
   * The lease of a grant, or undefined (the grant handed back) when it has already run out by our clock: a grant that
   * took longer than its ttl to arrive holds nothing its caller can use, and code run under it would run unprotected.
   */
  private leaseIfLive(key: string, result: Grant, started: number, o: CallOptions, handed = false): LeaseImpl | undefined {
    const expiresAt = result.expiresAt ?? started + result.ttl - this.store.drift(result.ttl);
    if (expiresAt <= this.store.now()) {
      this.handBack(key, result);
      return undefined;
    }
    const token = result.token;
    // Counted while live: nested leases of an owner (they share a token), and a lease a release here handed the lock to,
    // whose waiter's own acquire, failed or late, the store must not give back while it lives (watchLeases).
    const ties = o.owner === '' && !handed ? undefined : this.tie(token, o.owner !== '', handed);
    const lease = new LeaseImpl(this.store, key, token, result.fence, expiresAt, o.ttl, (e) => this.reportError(e), o.owner, ties, result.hold, result.cover);
    // Let in by a release in this process before the store recorded it: the lease holds on once the store confirms.
    result.confirmation?.then((at) => {
      if (at === null) lease.lose(new LockLostError(key, 'the lock could not be handed over to this lease: the releasing lease had ended'));
      else lease.confirm(at);
    });
    return lease;
  }

  /** Gives back a grant no lease was made for (one hold; a nested grant leaves the lock to the lease it nests in). */
  private handBack(key: string, grant: Grant): void {
    // Until its ttl at most: a store that sends it again where it failed (Redlock, whose every round has its own token
    // and hold) stops then.
    this.store.release(key, grant.token, undefined, this.liveLeases.has(grant.token), grant.hold, this.store.now() + grant.ttl, grant.cover).catch(
      () => undefined,
    );
  }

  // Leases of one owner nest under one token (a lease without an owner is always its lock's only hold): counted while
  // they have not ended, so that the store knows whether a release leaves the lock to another of them.
  private tie(token: string, owned: boolean, handed: boolean): LeaseTies {
    if (owned) count(this.liveLeases, token, 1);
    if (handed) count(this.handedLeases, token, 1);
    return {
      ended: () => {
        if (owned) count(this.liveLeases, token, -1);
        if (handed) count(this.handedLeases, token, -1);
      },
      shared: () => this.liveLeases.has(token),
    };
  }

  private reportError(event: LockErrorEvent): void {
    try {
      ignoreRejection(this.defaults.onError?.(event));
    } catch {
      // A throwing hook must not turn into an unhandled rejection inside a timer.
    }
  }
}
