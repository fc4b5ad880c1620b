// withLock(): option resolution, the locker to use, the per-request owner (reentrancy), and the lock lifecycle
// (acquire with auto-extension → map errors to HTTP → release exactly once), shared by the Express and Koa adapters.
import { checkTtl, defaultWait } from '../lock/locker.js';
import { MemoryLock } from '../lock/memory-lock.js';
import { assertClient, RedisLock } from '../lock/redis-lock.js';
import { Redlock } from '../lock/redlock.js';
import type { Lease, Locker, RedisClient, UsingOptions } from '../types.js';
import { randomToken } from '../util/token.js';
import * as v from '../util/validate.js';
import { onConnectionClose, type Closable } from './connection.js';
import { clientClosedError, lendRetryAfter, lockBusyError, lockUnavailableError } from './errors.js';
import { retryAfterSeconds } from './fields.js';
import { callKey, type KeyFunction } from './inputs.js';
import { checkOptionNames, optionErrors } from './options.js';
import { giveBackTakes } from './rate-limiter.js';

/** Options of `withLock()` shared by both adapters. */
export interface WithLockBaseOptions {
  /**
   * The locker: any `RedisLock`, `Redlock`, `MemoryLock` or other `Locker`.
   * @default built from `redis`, else one `MemoryLock` shared by every withLock of this process
   */
  locker?: Locker | undefined;
  /**
   * One ioredis client: a `RedisLock` on it; an array of clients of independent masters: a `Redlock` over them.
   * Lockers built this way are shared by every withLock given the same client(s).
   * @default none
   */
  redis?: RedisClient | readonly RedisClient[] | undefined;
  /**
   * Milliseconds the lock lives without extension.
   * @default the locker's ttl (30_000)
   */
  ttl?: number | undefined;
  /**
   * Milliseconds to wait for a busy lock before answering 423. A client that disconnects while its request waits stops
   * the wait: the handler does not run, and the app's error handling gets a 499 (code `CLIENT_CLOSED_REQUEST`) for its
   * logs. The same holds for a wait that comes from the `wait` option of a `locker` hasp made (`RedisLock`, `Redlock`,
   * `MemoryLock`); for a locker of your own, set this option to have the wait watched.
   * @default the locker's wait (0: answer at once)
   */
  wait?: number | undefined;
  /**
   * Extend the lock before it expires for as long as the request is being handled.
   * @default true
   */
  autoExtend?: boolean | undefined;
}

/** A lock held for one request. */
export interface HeldLock {
  /** The lease (`req.lock` / `ctx.state.lock`). */
  readonly lease: Lease;
  /** Stops auto-extension and releases the lock. Only the first call does anything; never throws. */
  release(): void;
}

const OPTIONS = ['locker', 'redis', 'ttl', 'wait', 'autoExtend'] as const;

// Lockers built by the middleware, shared so that two routes locking the same key exclude each other and one client
// gets one wake-up subscriber. Keyed by client (Redlock: by its first client, then by the whole list). Kept under a
// Symbol.for on globalThis, so that an app loading both builds of core (ESM and CommonJS: withLock from each) shares
// them too: two MemoryLocks would not exclude each other. Only the Locker interface is used across builds.
interface SharedLockers {
  memoryLock?: Locker;
  readonly redisLocks: WeakMap<object, Locker>;
  readonly redlocks: WeakMap<object, { clients: readonly RedisClient[]; locker: Locker }[]>;
}
const SHARED = Symbol.for('hasp.withLock.lockers');
const shared = ((globalThis as { [SHARED]?: SharedLockers })[SHARED] ??= { redisLocks: new WeakMap(), redlocks: new WeakMap() });
const redisLocks = shared.redisLocks;
const redlocks = shared.redlocks;

/** The locker `withLock` uses for these options: the given one, one built from `redis`, or the shared MemoryLock. */
export function lockerFor(options: Pick<WithLockBaseOptions, 'locker' | 'redis'>): Locker {
  if (options.locker !== undefined) {
    if (options.redis !== undefined) throw new TypeError('pass either locker or redis, not both');
    const l = options.locker as Partial<Locker> | null;
    if (typeof l !== 'object' || l === null || typeof l.using !== 'function' || typeof l.acquire !== 'function') {
      throw new TypeError(`locker must be a Locker (RedisLock, Redlock, MemoryLock), got ${v.describe(options.locker)}`);
    }
    return options.locker;
  }
  const redis = options.redis;
  if (redis === undefined) return (shared.memoryLock ??= new MemoryLock());
  if (Array.isArray(redis)) {
    const clients = redis as readonly RedisClient[];
    if (clients.length === 0) throw new TypeError('redis must be a client or a non-empty array of clients, got an empty array');
    clients.forEach((c, i) => assertClient(`redis[${i}]`, c));
    const first = clients[0] as object;
    let list = redlocks.get(first);
    const found = list?.find((e) => e.clients.length === clients.length && e.clients.every((c, i) => c === clients[i]));
    if (found) return found.locker;
    const locker = new Redlock(clients);
    if (!list) redlocks.set(first, (list = []));
    list.push({ clients: [...clients], locker });
    return locker;
  }
  assertClient('redis', redis);
  let locker = redisLocks.get(redis as object);
  if (!locker) {
    locker = new RedisLock(redis as RedisClient);
    redisLocks.set(redis as object, locker);
  }
  return locker;
}

// Symbol.for, so both module formats of core (a CJS adapter next to ESM user code) agree on a request's owner.
const OWNER = Symbol.for('hasp.lock.owner');

/**
 * The lock owner of one request: a random token stored on `carrier` (Express `req`, Koa `ctx`), so every withLock of
 * that request acquires as the same owner and a nested withLock on the same key re-enters instead of deadlocking.
 */
export function requestOwner(carrier: object): string {
  const c = carrier as { [OWNER]?: string };
  let owner = c[OWNER];
  if (owner === undefined) {
    owner = randomToken();
    Object.defineProperty(carrier, OWNER, { value: owner, enumerable: false, configurable: true });
  }
  return owner;
}

const ignore = (): void => {};

class Held implements HeldLock {
  private done = false;

  constructor(
    readonly lease: Lease,
    private readonly finish: () => void,
  ) {}

  release(): void {
    if (this.done) return;
    this.done = true;
    // Send the release now, synchronously, rather than a few promise turns later from `using`'s finally, and written
    // out at once rather than merged with the turn's other calls: its command then reaches Redis before the response
    // that tells the client the handler is done, so a request the client sends next through another process cannot
    // overtake it (it got a 423 with the whole ttl as Retry-After). `using` awaits this same release (it is idempotent)
    // and reports its failure. (A Locker of the user's own may hand out leases without releaseNow.)
    const lease = this.lease as Lease & { releaseNow?: () => Promise<boolean> };
    (typeof lease.releaseNow === 'function' ? lease.releaseNow() : lease.release()).catch(ignore);
    this.finish();
  }
}

/**
 * Acquires `key` through `locker.using`, so the lease is auto-extended (unless `autoExtend: false`) and released in
 * `using`'s `finally` (a failing release goes to the locker's `onError`), and resolves once the lock is held. The lock
 * stays held until {@link HeldLock.release}.
 * @throws a 423 `http-errors` error (`LOCK_BUSY`, Retry-After when the holder's remaining time is known) when busy; a
 *   503 (`LOCK_UNAVAILABLE`) when the locker cannot answer; any other error as it is
 */
export function holdLock(locker: Locker, key: string, options: UsingOptions): Promise<HeldLock> {
  return new Promise<HeldLock>((resolve, reject) => {
    let held = false;
    const run = (lease: Lease): Promise<void> =>
      new Promise<void>((finish) => {
        held = true;
        resolve(new Held(lease, finish));
      });
    let using: Promise<void>;
    try {
      using = locker.using(key, run, options);
    } catch (error) {
      reject(httpLockError(error));
      return;
    }
    using.catch((error: unknown) => {
      // Before the lock was held: the acquisition failed. After: only a release failure, already given to onError.
      if (!held) reject(httpLockError(error));
    });
  });
}

/** Maps a locker's error onto the HTTP error withLock answers with: 423, 503, or the error itself. */
export function httpLockError(error: unknown): unknown {
  const e = error as { code?: unknown; retryAfter?: unknown } | null;
  if (e?.code === 'LOCK_BUSY') {
    const ms = typeof e.retryAfter === 'number' && e.retryAfter >= 0 ? e.retryAfter : undefined;
    return lockBusyError(ms === undefined ? undefined : retryAfterSeconds(ms), error);
  }
  if (e?.code === 'LOCK_UNAVAILABLE') return lockUnavailableError(error);
  return error;
}

/**
 * withLock's options resolved once, and {@link LockGuard.acquire} per request.
 * @typeParam Arg - what the key function receives (Express `req`, Koa `ctx`)
 */
export class LockGuard<Arg> {
  /** The locker every request of this middleware uses. */
  readonly locker: Locker;
  private readonly keyFn: KeyFunction<Arg>;
  private readonly using: UsingOptions;
  private readonly where: string;
  // Only requests that may wait watch for their client leaving: a fail-fast acquire needs no listener.
  private readonly waits: boolean;

  /**
   * @throws TypeError or RangeError naming the option when an option is missing or invalid
   */
  constructor(key: KeyFunction<Arg>, options: WithLockBaseOptions | undefined, where = 'withLock') {
    this.where = where;
    const resolved = optionErrors(where, () => {
      if (typeof key !== 'function') {
        throw new TypeError(`key (the first argument) must be a function of the request returning a string, got ${v.describe(key)}`);
      }
      if (options !== undefined && (options === null || typeof options !== 'object')) {
        throw new TypeError(`options must be an object, got ${v.describe(options)}`);
      }
      const o = v.definedOnly(options);
      checkOptionNames(o, OPTIONS);
      const using: UsingOptions = {};
      if (o.ttl !== undefined) using.ttl = v.duration('ttl', o.ttl);
      if (o.wait !== undefined) using.wait = v.duration('wait', o.wait, true);
      using.autoExtend = o.autoExtend === undefined ? true : v.boolean('autoExtend', o.autoExtend);
      const locker = lockerFor(o);
      // A ttl within the locker's drift allowance would fail every request; say so now.
      if (using.ttl !== undefined) checkTtl(locker, using.ttl);
      return { locker, using };
    });
    this.keyFn = key;
    this.locker = resolved.locker;
    this.using = resolved.using;
    // A locker's own default wait is a wait too: a client that leaves must stop it as it stops the option's. A locker
    // hasp did not make cannot tell its wait, and is not handed a signal it never asked for: give withLock the `wait`.
    this.waits = (resolved.using.wait ?? defaultWait(resolved.locker) ?? 0) > 0;
  }

  /**
   * Reads the request's key and acquires its lock as the request's owner. Resolves `undefined` when the key is
   * `undefined` (no lock for this request).
   * @param arg - what the key function receives
   * @param carrier - the per-request object the owner is kept on (Express `req`, Koa `ctx`)
   * @param res - the Node response: with a `wait` option, a client that disconnects while waiting stops the wait
   * @throws a 500 (`INVALID_KEY`) for a bad key, 423 (`LOCK_BUSY`), 503 (`LOCK_UNAVAILABLE`), or 499
   *   (`CLIENT_CLOSED_REQUEST`) when the client went away while waiting
   */
  async acquire(arg: Arg, carrier: object, res?: ClosableResponse): Promise<HeldLock | undefined> {
    const k = callKey(this.where, this.keyFn, arg);
    const key = typeof k === 'object' ? await k : k;
    if (key === undefined) return undefined;
    const options: UsingOptions = { ...this.using, owner: requestOwner(carrier) };
    if (res === undefined || !this.waits) return holdLock(this.locker, key, options);
    // Requests queued for a busy lock whose clients have gone would otherwise each take the lock in turn, running
    // handlers nobody reads while the clients still there wait behind them.
    const gone = new AbortController();
    const onClose = (): void => {
      if (!res.writableEnded) gone.abort(clientClosedError());
    };
    // A pipelined request's response waits for the one ahead of it before it gets the socket, and never closes if the
    // connection goes meanwhile: the connection's own close tells then. (Its request's 'close' would not: that also
    // fires once a body has been read.)
    const connection = res.socket == null ? res.req?.socket : undefined;
    let unwatch: (() => void) | undefined;
    if (res.destroyed || connection?.destroyed === true) onClose();
    else {
      res.once('close', onClose);
      if (connection != null) unwatch = onConnectionClose(connection, onClose);
    }
    options.signal = gone.signal;
    try {
      return await holdLock(this.locker, key, options);
    } finally {
      res.off('close', onClose);
      unwatch?.();
    }
  }
}

/** What {@link LockGuard.acquire} needs of a response to notice that the client went away. */
export interface ClosableResponse extends Closable {
  readonly writableEnded: boolean;
  /** Null until a pipelined request's turn comes (Node's `ServerResponse`). */
  readonly socket?: unknown;
  readonly req?: { readonly socket?: Closable | null };
}

/**
 * For the adapters, with a request that {@link LockGuard.acquire} refused (busy, unavailable, a bad key, the client
 * gone), before its error goes on: the request costs nothing in the hasp rate limits before `withLock` (their takes,
 * recorded on `home`, are given back), and the error's `Retry-After` goes on the response too, for error pages that
 * send none of `err.headers`.
 * @param home - the per-request object the rate limiters recorded their takes on (Express `res.locals`, Koa `ctx.state`)
 * @param res - the Node response
 */
export async function refuseLock(home: object, res: Parameters<typeof lendRetryAfter>[0], error: unknown): Promise<void> {
  await giveBackTakes(home);
  lendRetryAfter(res, error);
}
