// Model-based tests of the lockers (fast-check commands): random acquire / tryAcquire / extend / release / clock moves
// against a small model of one lock per key with reentrant owners, checking mutual exclusion, fences and every result.
import fc from 'fast-check';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  LockBusyError,
  LockLostError,
  MemoryLock,
  RedisLock,
  Redlock,
  type Lease,
  type Locker,
} from '../../packages/core/src/index.js';
import { startRedis, startRedisNodes, stopAll, type RedisNode } from '../harness/redis.js';
import { rejection, uniquePrefix } from '../core/helpers.js';

afterAll(async () => {
  await stopAll();
});

const KEYS = ['a', 'b'] as const;
const OWNERS = [undefined, 'alice', 'bob'] as const;
// Leases arm real (unref'd) timers for their expiry, compared with the injected clock when they fire. With ttls of
// a minute or more no such timer fires while a run lasts, so the only expiry is the one the model makes: moving
// the injected clock. A lease whose time ran out this way is lost as soon as its signal is read (or it is extended),
// which checkInvariants does after every command.
const TTLS = [60_000, 120_000, 300_000] as const;

interface ModelLock {
  id: number;
  owner: string | undefined;
  /** Each lease's hold (by its index in `leases`) and when it ends: nested leases end on their own. */
  holds: Map<number, number>;
  fence: number;
}

interface ModelLease {
  key: string;
  lockId: number;
  fence: number;
  expiresAt: number;
  released: boolean;
  lost: boolean;
}

interface Model {
  /** The clock, ms; only the memory run moves it. */
  now: number;
  locks: Map<string, ModelLock>;
  leases: ModelLease[];
  lastFence: Map<string, number>;
  nextId: number;
  /** Whether lease expiry times are exact (injected clock) or only bounded (real time on Redis). */
  exactTime: boolean;
}

interface Real {
  locker: Locker;
  leases: Lease[];
  /** Tokens of the model's lock ids, to check that nested leases share their lock's token. */
  tokens: Map<number, string>;
  clock: { t: number };
}

/**
 * The key's lock if a hold of it has not ended, without those that have (in real time nothing expires during a run:
 * ttls are a minute or more).
 */
function liveLock(m: Model, key: string): ModelLock | undefined {
  const lock = m.locks.get(key);
  if (!m.exactTime || !lock) return lock;
  for (const [lease, end] of lock.holds) if (end <= m.now) lock.holds.delete(lease);
  if (lock.holds.size > 0) return lock;
  m.locks.delete(key);
  return undefined;
}

/** When the lock ends: with its latest hold. */
function lockEnd(lock: ModelLock): number {
  return Math.max(...lock.holds.values());
}

/** In real time (Redis), the model's clock is the wall clock. */
function tick(m: Model, r: Real): void {
  if (m.exactTime) return;
  m.now = Date.now();
  r.clock.t = m.now;
}

/** Mutual exclusion and the state of every lease's signal, after each command. */
function checkInvariants(m: Model, r: Real): void {
  for (const key of KEYS) {
    // Every lease that is neither released nor lost and whose expiresAt lies ahead belongs to the key's live lock.
    const valid = r.leases.filter((l, i) => l.key === key && !m.leases[i]!.released && !m.leases[i]!.lost && l.expiresAt > r.clock.t);
    const tokens = new Set(valid.map((l) => l.token));
    expect(tokens.size, `leases valid at once on ${key}`).toBeLessThanOrEqual(1);
    const lock = liveLock(m, key);
    if (valid.length > 0) {
      expect(lock, `a valid lease on ${key} has a live lock`).toBeDefined();
      expect([...tokens][0]).toBe(r.tokens.get(lock!.id));
      if (m.exactTime) for (const l of valid) expect(l.expiresAt).toBeLessThanOrEqual(lockEnd(lock!));
    }
  }
  for (const [i, lease] of r.leases.entries()) {
    const ml = m.leases[i]!;
    // Read past its end by the clock, a lease's signal reports it lost.
    if (m.exactTime && ml.expiresAt <= m.now && !ml.released) ml.lost = true;
    expect(lease.signal.aborted, `signal of lease ${i}`).toBe(ml.released || ml.lost);
    if (ml.lost) expect(lease.signal.reason).toBeInstanceOf(LockLostError);
    if (m.exactTime) expect(lease.expiresAt).toBe(ml.expiresAt);
  }
}

type Mode = 'tryAcquire' | 'acquire' | 'acquireWait';

class AcquireCommand implements fc.AsyncCommand<Model, Real> {
  constructor(
    readonly key: string,
    readonly owner: string | undefined,
    readonly ttl: number,
    readonly mode: Mode,
  ) {}

  check(m: Model): boolean {
    if (this.mode !== 'acquireWait') return true;
    // Waiting on a busy key would sleep in real time while the model's clock stands still: only when it is free.
    const lock = liveLock(m, this.key);
    return lock === undefined || (this.owner !== undefined && lock.owner === this.owner);
  }

  async run(m: Model, r: Real): Promise<void> {
    tick(m, r);
    const options = { ttl: this.ttl, owner: this.owner, ...(this.mode === 'acquireWait' ? { wait: 5_000 } : {}) };
    const before = Date.now();
    const call = this.mode === 'tryAcquire' ? r.locker.tryAcquire(this.key, options) : r.locker.acquire(this.key, options);
    const lock = liveLock(m, this.key);
    if (lock && (this.owner === undefined || lock.owner !== this.owner)) {
      // Busy.
      if (this.mode === 'tryAcquire') expect(await call).toBeNull();
      else {
        const error = await rejection(call);
        expect(error).toBeInstanceOf(LockBusyError);
        expect(error).toMatchObject({ code: 'LOCK_BUSY', key: this.key });
        if (m.exactTime) expect((error as LockBusyError).retryAfter).toBe(lockEnd(lock) - m.now);
      }
      return;
    }
    const lease = await call;
    expect(lease).not.toBeNull();
    expect(lease!.key).toBe(this.key);
    expect(lease!.signal.aborted).toBe(false);
    let held: ModelLock;
    if (lock) {
      // Re-entered by the same owner: same lock, same token and fence, one more hold (of its own ttl).
      held = lock;
      held.holds.set(m.leases.length, m.now + this.ttl);
      expect(lease!.token).toBe(r.tokens.get(held.id));
      expect(lease!.fence).toBe(held.fence);
    } else {
      // A new lock: a fence above every earlier one on this key.
      expect(lease!.fence).toBeGreaterThan(m.lastFence.get(this.key) ?? 0);
      held = { id: m.nextId++, owner: this.owner, holds: new Map([[m.leases.length, m.now + this.ttl]]), fence: lease!.fence };
      m.lastFence.set(this.key, lease!.fence);
      m.locks.set(this.key, held);
      r.tokens.set(held.id, lease!.token);
      expect(lease!.token.length).toBeGreaterThanOrEqual(22);
    }
    if (m.exactTime) expect(lease!.expiresAt).toBe(m.now + this.ttl);
    else {
      // Redis: its hold's ttl as the server saw it, less drift.
      expect(lease!.expiresAt).toBeGreaterThan(before + this.ttl * 0.98 - 10);
      expect(lease!.expiresAt).toBeLessThanOrEqual(Date.now() + this.ttl);
    }
    m.leases.push({ key: this.key, lockId: held.id, fence: held.fence, expiresAt: lease!.expiresAt, released: false, lost: false });
    r.leases.push(lease!);
    checkInvariants(m, r);
  }

  toString(): string {
    return `${this.mode}(${this.key}, owner=${this.owner ?? '-'}, ttl=${this.ttl})`;
  }
}

class ReleaseCommand implements fc.AsyncCommand<Model, Real> {
  constructor(readonly pick: number) {}

  check(m: Model): boolean {
    return m.leases.length > 0;
  }

  async run(m: Model, r: Real): Promise<void> {
    tick(m, r);
    const i = this.pick % m.leases.length;
    const ml = m.leases[i]!;
    let expected = false;
    if (!ml.released) {
      ml.released = true;
      const lock = liveLock(m, ml.key);
      // Its own hold must not have ended (others of the lock may hold on).
      if (lock && lock.id === ml.lockId && lock.holds.delete(i)) {
        expected = true;
        if (lock.holds.size === 0) m.locks.delete(ml.key);
      }
    }
    expect(await r.leases[i]!.release(), `release of lease ${i}`).toBe(expected);
    checkInvariants(m, r);
  }

  toString(): string {
    return `release(#${this.pick})`;
  }
}

class ExtendCommand implements fc.AsyncCommand<Model, Real> {
  constructor(
    readonly pick: number,
    readonly ttl: number,
  ) {}

  check(m: Model): boolean {
    return m.leases.length > 0;
  }

  async run(m: Model, r: Real): Promise<void> {
    tick(m, r);
    const i = this.pick % m.leases.length;
    const ml = m.leases[i]!;
    const lease = r.leases[i]!;
    if (ml.released || ml.lost) {
      expect(await rejection(lease.extend(this.ttl))).toBeInstanceOf(LockLostError);
      checkInvariants(m, r);
      return;
    }
    const lock = liveLock(m, ml.key);
    const end = lock?.id === ml.lockId ? lock.holds.get(i) : undefined;
    if (lock && end !== undefined) {
      await lease.extend(this.ttl);
      // Its own hold (nested leases end on their own).
      lock.holds.set(i, Math.max(end, m.now + this.ttl));
      if (m.exactTime) ml.expiresAt = lock.holds.get(i)!;
      else ml.expiresAt = lease.expiresAt;
    } else {
      // The lock expired (or was freed and taken by another): the lease is lost for good.
      expect(await rejection(lease.extend(this.ttl))).toBeInstanceOf(LockLostError);
      ml.lost = true;
    }
    checkInvariants(m, r);
  }

  toString(): string {
    return `extend(#${this.pick}, ttl=${this.ttl})`;
  }
}

class AdvanceCommand implements fc.AsyncCommand<Model, Real> {
  constructor(readonly ms: number) {}

  check(m: Model): boolean {
    return m.exactTime;
  }

  async run(m: Model, r: Real): Promise<void> {
    m.now += this.ms;
    r.clock.t += this.ms;
    checkInvariants(m, r);
  }

  toString(): string {
    return `advance(${this.ms})`;
  }
}

const lockCommands = (withClock: boolean) => {
  const commands: fc.Arbitrary<fc.AsyncCommand<Model, Real>>[] = [
    fc
      .tuple(
        fc.constantFrom(...KEYS),
        fc.constantFrom(...OWNERS),
        fc.constantFrom(...TTLS),
        fc.constantFrom<Mode>('tryAcquire', 'acquire', 'acquireWait'),
      )
      .map(([key, owner, ttl, mode]) => new AcquireCommand(key, owner, ttl, mode)),
    fc.nat().map((pick) => new ReleaseCommand(pick)),
    fc.tuple(fc.nat(), fc.constantFrom(...TTLS)).map(([pick, ttl]) => new ExtendCommand(pick, ttl)),
  ];
  if (withClock) commands.push(fc.constantFrom(1, 30_000, 59_999, 60_000, 150_000, 400_000).map((ms) => new AdvanceCommand(ms)));
  return fc.commands(commands, { maxCommands: 40, size: 'max' });
};

function emptyModel(now: number, exactTime: boolean): Model {
  return { now, locks: new Map(), leases: [], lastFence: new Map(), nextId: 1, exactTime };
}

describe('MemoryLock against the lock model, on an injected clock', () => {
  it('keeps mutual exclusion, reentrancy, growing fences, and the documented results of every call', async () => {
    await fc.assert(
      fc.asyncProperty(lockCommands(true), async (cmds) => {
        const clock = { t: 1_700_000_000_000 };
        const locker = new MemoryLock({ clock: () => clock.t });
        const real: Real = { locker, leases: [], tokens: new Map(), clock };
        try {
          await fc.asyncModelRun(() => ({ model: emptyModel(clock.t, true), real }), cmds);
        } finally {
          for (const lease of real.leases) await lease.release();
          locker.close();
        }
      }),
      { numRuns: 300 },
    );
  });
});

/**
 * Runs the model against lockers `make` builds (one per run, on a prefix of its own), in real time: no clock moves and
 * ttls of a minute, so nothing expires during a run and real time can stand for the model's.
 */
function realTimeRuns(make: (prefix: string) => Locker & { close(): void }, numRuns: number): Promise<void> {
  return fc.assert(
    fc.asyncProperty(lockCommands(false), async (cmds) => {
      const locker = make(uniquePrefix('model'));
      const real: Real = { locker, leases: [], tokens: new Map(), clock: { t: Date.now() } };
      try {
        await fc.asyncModelRun(() => ({ model: emptyModel(Date.now(), false), real }), cmds);
      } finally {
        for (const lease of real.leases) await lease.release();
        locker.close();
      }
    }),
    { numRuns },
  );
}

describe('RedisLock against the lock model, in real time', () => {
  let node: RedisNode;
  let redis: Redis;

  beforeAll(async () => {
    node = await startRedis();
    redis = node.client();
  });

  it('keeps mutual exclusion, reentrancy, growing fences, and the documented results of every call', async () => {
    await realTimeRuns((prefix) => new RedisLock(redis, { prefix }), 60);
  });
});

describe('Redlock (3 nodes) against the lock model, in real time', () => {
  let clients: Redis[];

  beforeAll(async () => {
    clients = (await startRedisNodes(3)).map((n) => n.client());
  });

  it('keeps mutual exclusion, reentrancy, growing fences, and the documented results of every call', async () => {
    await realTimeRuns((prefix) => new Redlock(clients, { prefix }), 40);
  });
});
