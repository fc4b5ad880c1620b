// Public types of @hasp/core: the Locker contract shared by every backend, and the token bucket's Decision.
import type { Cluster, Redis } from 'ioredis';
import type { HaspError } from './errors.js';

/** An ioredis client: a single `Redis` connection or a `Cluster`. */
export type RedisClient = Redis | Cluster;

/** Per-call options of {@link Locker.acquire} and {@link Locker.tryAcquire}. */
export interface AcquireOptions {
  /**
   * Milliseconds the lock lives without extension.
   * @default the locker's `ttl` (30_000)
   */
  ttl?: number | undefined;
  /**
   * Milliseconds to keep trying while the key is busy. Waiters queue, and the lock goes to them in order of arrival,
   * across processes: a release wakes the first one (pub/sub on Redis), with polling only as a fallback.
   * @default the locker's `wait` (0: fail fast)
   */
  wait?: number | undefined;
  /**
   * Reentrancy: acquiring a key already held by the same owner returns a nested lease on the same lock
   * (same token and fence), with its own ttl. The lock is freed when every nested lease is released or has run out.
   * @default none: every acquire is its lock's only hold
   */
  owner?: string | undefined;
  /**
   * Stops the acquire at once, also while an attempt waits on Redis: it rejects with the signal's reason (a lock
   * granted after that is given back). In `using` it covers the acquire only: once `fn` runs, an abort does not stop
   * it (`fn` can watch the signal itself), and `using` settles with what `fn` returns.
   * @default none
   */
  signal?: AbortSignal | undefined;
}

/** Options of {@link Locker.using}. */
export interface UsingOptions extends AcquireOptions {
  /**
   * Extend the lease before it expires for as long as the function runs. When an extension fails for good,
   * `lease.signal` aborts with a {@link LockLostError} so the function can stop.
   * @default true
   */
  autoExtend?: boolean | undefined;
}

/** A held lock. Obtained from {@link Locker.acquire}, {@link Locker.tryAcquire} or {@link Locker.using}. */
export interface Lease {
  /** The key as the caller gave it. */
  readonly key: string;
  /** This holder's id: 128 random bits, base64url. Nested leases of one owner share the token. */
  readonly token: string;
  /**
   * Fencing token: every later lease on the same key has a larger fence (on Redlock too). Pass it to the
   * resource you protect and have the resource reject writes carrying a smaller fence than one it has seen.
   */
  readonly fence: number;
  /**
   * Epoch ms until which the lease is surely held; conservative (round trip and clock drift taken off). It moves later
   * when the lease is extended, and when Redis records a hand-over within the process that let this lease in (see
   * "Hand-offs within a process" in the core README). Counted on the monotonic clock, which does not follow steps of
   * the system clock: it agrees with `Date.now()` unless the system clock was stepped since hasp was loaded.
   */
  readonly expiresAt: number;
  /**
   * Aborted when the lease is released, lost, or expires. The reason says which. Reading it checks the clock, so after
   * a stall of the event loop past `expiresAt` (a long synchronous step, a debugger) `lease.signal.aborted` is already
   * true, before the expiry timer has run.
   */
  readonly signal: AbortSignal;
  /**
   * Keeps the lock for at least `ttl` more ms (never shortens it). A nested lease (same `owner`) extends its own hold
   * of the lock, not the others'.
   * @param ttl - defaults to the ttl the lease was acquired with
   * @throws {@link LockLostError} when the lease is no longer held, or its `expiresAt` has passed (even if Redis still
   *   holds the lock: the lease has ended for its holder), also when that happens while the extension is on its way
   *   (the lock is then released); {@link LockUnavailableError} when the store cannot answer
   */
  extend(ttl?: number): Promise<void>;
  /**
   * Releases this lease. Idempotent: resolves `true` when this call released a lease that was still held,
   * `false` when it was already released (also by a call still on its way, after which it answers) or had expired
   * or been lost (and when ioredis sent it again after a
   * reconnect and only the second run was answered: that run found nothing left to drop). For a nested lease (same
   * `owner`) that is `true` too, although the lock stays held until the last of its leases is released or has run out.
   * @throws {@link LockUnavailableError} when the store cannot answer; hasp sends it again in the background until it
   *   gets through or the lease would have ended, and calling again retries too
   */
  release(): Promise<boolean>;
}

/** What every locker ({@link RedisLock}, {@link Redlock}, {@link MemoryLock}) offers. Middleware takes any of them. */
export interface Locker {
  /**
   * Acquires `key`, waiting up to `wait` ms while it is busy.
   * @throws {@link LockBusyError} when still busy after `wait`; {@link LockUnavailableError} when the store fails or has no quorum;
   *   the signal's reason when `signal` aborts
   */
  acquire(key: string, options?: AcquireOptions): Promise<Lease>;
  /**
   * Like {@link Locker.acquire}, but resolves `null` instead of throwing when the key is busy.
   * @throws {@link LockUnavailableError} when the store fails or has no quorum
   */
  tryAcquire(key: string, options?: AcquireOptions): Promise<Lease | null>;
  /**
   * Acquires `key`, runs `fn`, and releases in `finally` (also when `fn` throws), settling once the release has. With
   * `autoExtend` (default) the lease is extended while `fn` runs; if it is lost, `lease.signal` aborts, and `using`
   * waits on the release only while the store may still hold the key by what it answered (a ttl from its last reply). A
   * failed release goes to `onError`, never in place of `fn`'s outcome.
   */
  using<T>(key: string, fn: (lease: Lease) => Promise<T>, options?: UsingOptions): Promise<T>;
}

/** What happened in the background, reported to a locker's `onError` hook. */
export interface LockErrorEvent {
  /**
   * `extend`: an auto-extension failed (once per run of failed retries, until one gets through); `release`: a release
   * inside `using` failed; `lost`: a lease was lost (when it ran out while its extensions failed, the last failure is
   * the error's `cause`).
   */
  readonly operation: 'extend' | 'release' | 'lost';
  /** The key concerned. */
  readonly key: string;
  /** The error: a {@link HaspError}. */
  readonly error: HaspError;
}

/** Constructor options every locker takes. */
export interface LockerOptions {
  /**
   * Default `ttl` of leases, in ms.
   * @default 30_000
   */
  ttl?: number | undefined;
  /**
   * Default `wait`, in ms.
   * @default 0
   */
  wait?: number | undefined;
  /**
   * Called for failures that happen in the background (auto-extension, release inside `using`, a lost lease),
   * which are never thrown as unhandled rejections.
   * @default none
   */
  onError?: ((event: LockErrorEvent) => void) | undefined;
}

/** Options of {@link RedisLock}. */
export interface RedisLockOptions extends LockerOptions {
  /**
   * Prefix of every Redis key and channel this locker uses.
   * @default 'hasp:lock:'
   */
  prefix?: string | undefined;
  /**
   * Milliseconds one Redis round trip may take before the operation fails with {@link LockUnavailableError}.
   * While the client is reconnecting, operations fail at once instead of queueing.
   * @default 2_000
   */
  timeout?: number | undefined;
}

/** Options of {@link Redlock}. */
export interface RedlockOptions extends RedisLockOptions {
  /**
   * Share of the ttl taken off a lease's validity for clock drift between nodes: drift = ttl × driftFactor + 2 ms.
   * @default 0.01
   */
  driftFactor?: number | undefined;
  /**
   * Number of nodes that must agree.
   * @default Math.floor(N / 2) + 1
   */
  quorum?: number | undefined;
  /**
   * Milliseconds one node may take to answer before it counts as failed for this attempt. Kept far below the ttl.
   * @default min(timeout, max(100, ttl / 100)) per attempt
   */
  nodeTimeout?: number | undefined;
  /**
   * Further attempts after an attempt failed for lack of quorum because nodes were down or slow, or because the vote
   * split (racing callers each won a minority of a free key). Busy keys are retried within `wait` instead.
   * @default 2
   */
  retryCount?: number | undefined;
  /**
   * Base delay in ms before such a retry; a random jitter of up to the same amount is added.
   * @default 50
   */
  retryDelay?: number | undefined;
}

/** Options of {@link MemoryLock}. */
export interface MemoryLockOptions extends LockerOptions {
  /**
   * Accepted (and validated) like the Redis lockers' `prefix`, so one options object fits every locker. A MemoryLock
   * keeps its keys in its own store, where no prefix is needed.
   * @default 'hasp:lock:'
   */
  prefix?: string | undefined;
  /**
   * Clock in epoch ms; injectable so tests can move time without sleeping. It decides who holds a key and each
   * lease's `expiresAt`; a lease's `signal` aborts on expiry by a real timer, or when it is read after the clock has
   * passed `expiresAt`: after moving the clock, read `lease.signal` (or call `extend()`, which then rejects) rather
   * than waiting for an abort event.
   * It must return a finite number (not a `Date`): it is called once when the lock is made, and an acquire that starts
   * on any other reading (or a throw) rejects with a `TypeError` naming `clock`; a bad reading at any other moment
   * (a timer's, the grant's) counts on from the last good one by the real clock, so leases and held keys still end,
   * and a clock that comes back below where that got stands there until it passes it (time never goes back across a
   * bad spell, so a key may be held past its ttl by the spell's length).
   * @default epoch ms on the monotonic clock (`Date.now()` when hasp was loaded, plus `performance.now()` since): a
   *   stepped system clock neither frees held locks nor stretches leases
   */
  clock?: (() => number) | undefined;
}

/** The outcome of {@link TokenBucket.take} and {@link TokenBucket.peek}. A denial is a value, not an exception. */
export interface Decision {
  /** Whether `cost` tokens were (take) or would be (peek) granted. */
  allowed: boolean;
  /** The bucket's capacity. */
  limit: number;
  /** Whole tokens left after this decision. */
  remaining: number;
  /** Ms until `cost` tokens are there; 0 when allowed. */
  retryAfter: number;
  /** Ms until the bucket is full again. */
  resetAfter: number;
}

/** Options of {@link TokenBucket}. */
export interface TokenBucketOptions {
  /** Bucket size: the most tokens a key can hold (and so the largest burst). Must be > 0. */
  capacity: number;
  /** Refill rate: tokens per second, or a string such as `'2/s'`, `'30/min'`, `'100/h'`, `'1000/d'`, `'5/10s'`. */
  rate: number | string;
  /**
   * Where buckets live. Absent: in memory, for this process only.
   * @default none (in-memory)
   */
  redis?: RedisClient | undefined;
  /**
   * Prefix of every Redis key.
   * @default 'hasp:tb:'
   */
  prefix?: string | undefined;
  /**
   * Milliseconds one Redis round trip may take before `take` rejects. While the client is reconnecting, calls fail at once.
   * @default 2_000
   */
  timeout?: number | undefined;
  /**
   * Clock of the in-memory store in epoch ms (ignored with `redis`, which uses the Redis server's clock). Fractions of a
   * ms count: a bucket that refills faster than `capacity` tokens per ms needs them. It must return a finite number
   * (not a `Date`): it is called once when the bucket is made, and a take or peek on any other reading (or a throw)
   * rejects with a `TypeError` naming `clock`; a bad reading at any other moment (a give-back's) counts on from the
   * last good one by the real clock, and time never goes back across such a spell.
   * @default `Date.now()`, with the fraction of a ms that `performance.now()` adds (`Date.now()` alone while either is
   *   replaced, as fake timers do)
   */
  clock?: (() => number) | undefined;
}
