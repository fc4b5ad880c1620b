// TokenBucket: a continuous token bucket per key, in memory or atomically on Redis with the server's clock.
import { assertClient } from '../lock/redis-lock.js';
import { checkPrefix } from '../redis/keys.js';
import type { Decision, TokenBucketOptions } from '../types.js';
import * as v from '../util/validate.js';
import { wallNow } from '../util/clock.js';
import { type BucketStore, MemoryBucketStore, RedisBucketStore } from './bucket-store.js';
import { gcraParams } from './gcra.js';
import { parseRate } from './rate.js';

const OPTIONS = ['capacity', 'rate', 'redis', 'prefix', 'timeout', 'clock'] as const;

/** Defaults of {@link TokenBucket}. */
export const TOKEN_BUCKET_DEFAULTS = { prefix: 'hasp:tb:', timeout: 2_000 } as const;

// Time is counted in whole microseconds: a faster rate could not be kept.
const MAX_RATE = 1_000_000;
// Longest time an empty bucket may take to refill (~71 years): keeps every TAT (now + up to twice this) below 2^53 µs,
// where doubles stop being exact, and every Redis expiry a plain integer.
const MAX_REFILL_US = 2 ** 51;

// Each bucket's store, for the middleware's takes that may have to be given back (see storeOf). A map rather than a
// member, so that the class's public shape stays what the docs describe.
const STORES = new WeakMap<object, BucketStore>();
// On every TokenBucket, whichever copy of this module made it (Symbol.for), and seen through a wrapper: tells a bucket
// whose store this copy cannot reach (see storeOf) from an object of the user's that merely has a take().
const BUCKET_BRAND = Symbol.for('hasp.tokenBucket');

/**
 * A token bucket per key: each key holds up to `capacity` tokens and regains `rate` tokens per second; a bucket starts
 * full. On Redis each `take` is one script call that reads the server's clock, so app servers with skewed clocks agree,
 * and a bucket that is full again leaves no key behind.
 *
 * On Redis, a key this object has seen short of tokens (a denial, or a take that emptied it) is remembered for up to
 * its retry time (at most 1 s, for at most 10 000 keys): a take that bucket would certainly refuse is then answered
 * from memory, with the same numbers aged on this process's clock, without a round trip, so a flooded key costs Redis a
 * few calls per second instead of one per request. It only ever refuses, so nothing is admitted beyond the bucket's
 * budget. The one cost: a reset made elsewhere (another process's `reset`, a deleted key) can go unseen here for up to
 * 1 s; {@link TokenBucket.reset} on this object takes effect at once. A denial answered from memory resolves without
 * any I/O, so a loop that retries at once must yield to the event loop (better: wait `retryAfter`).
 *
 * @example
 * ```ts
 * import { TokenBucket } from '@hasp/core';
 * const sms = new TokenBucket({ capacity: 3, rate: '3/10min' });
 * const d = await sms.take('+15551234567');
 * if (!d.allowed) console.log(`try again in ${Math.ceil(d.retryAfter / 1000)} s`);
 * ```
 */
export class TokenBucket {
  /** The bucket size. */
  readonly capacity: number;
  /** Tokens regained per second. */
  readonly rate: number;
  /** The Redis client, when the buckets live in Redis. */
  readonly redis: TokenBucketOptions['redis'];
  private readonly store: BucketStore;

  /**
   * Time is counted in whole microseconds: each token's interval is `1e6 / rate` µs rounded up, so the bucket refills
   * at most 1 µs per token slower than `rate` (0.1 % at 1 000/s), never faster. Hence `rate` is at most 1 000 000/s,
   * and `capacity / rate` (the time an empty bucket takes to refill) at most about 71 years.
   * @throws TypeError or RangeError naming the option when an option is invalid
   */
  constructor(options: TokenBucketOptions) {
    if (options === null || typeof options !== 'object') {
      throw new TypeError('TokenBucket options must be an object with capacity and rate');
    }
    const o = v.withDefaults(TOKEN_BUCKET_DEFAULTS, options);
    v.knownKeys('TokenBucket', v.definedOnly(options), OPTIONS);
    if (o.capacity === undefined) throw new TypeError('capacity is required');
    if (o.rate === undefined) throw new TypeError('rate is required');
    this.capacity = v.positiveNumber('capacity', o.capacity);
    this.rate = parseRate(o.rate);
    if (this.rate > MAX_RATE) throw new RangeError(`rate must be at most ${MAX_RATE} tokens per second, got ${this.rate}`);
    const params = gcraParams(this.capacity, this.rate);
    if (params.capacity * params.interval < 1) {
      // Every take costs at least 1 µs of refill, so such a bucket could never grant anything.
      throw new RangeError(`capacity must hold at least 1 µs of refill (capacity × 1e6 / rate >= 1), got capacity ${this.capacity} at rate ${this.rate}/s`);
    }
    if (params.capacity * params.interval > MAX_REFILL_US) {
      throw new RangeError(
        `capacity / rate must be at most ${Math.floor(MAX_REFILL_US / 1e6)} s (the time an empty bucket takes to refill), ` +
          `got capacity ${this.capacity} at rate ${this.rate}/s`,
      );
    }
    const prefix = checkPrefix(v.string('prefix', o.prefix));
    const timeout = v.duration('timeout', o.timeout);
    // Validated even when unused (with redis), so a mistake shows at start-up.
    const clock = o.clock === undefined ? undefined : v.clock('clock', o.clock);
    if (o.redis !== undefined) {
      assertClient('redis', o.redis);
      this.redis = o.redis;
      this.store = new RedisBucketStore(o.redis, prefix, params, timeout);
    } else {
      // Date.now is looked up at each call (in wallNow), so fake timers installed after construction still apply.
      this.store = new MemoryBucketStore(params, clock?.now ?? wallNow, clock?.check);
    }
    STORES.set(this, this.store);
  }

  /**
   * Takes `cost` tokens from `key`'s bucket if it has them; a denial consumes nothing.
   * On Redis, a take that timed out (or was cut off by a reconnect, which makes ioredis send it again) may still be
   * applied when the server answers later: its tokens are then spent although the caller was told Redis was
   * unavailable. hasp then gives its tokens back if nothing else has touched the bucket since; otherwise they stay spent
   * (removing them from under later takes could admit more than the bucket allows), which errs on the side of
   * refusing, by at most one take per failed call.
   * @throws (rejects) at once, naming the argument: TypeError for a key that is not a string or a cost that is not a
   *   number, RangeError for an empty key or a cost that is not > 0 or exceeds the capacity;
   *   {@link RateLimitUnavailableError} when Redis cannot answer
   */
  take(key: string, cost = 1): Promise<Decision> {
    return this.decide(key, cost, true);
  }

  /** What {@link TokenBucket.take} would decide now; consumes nothing. */
  peek(key: string, cost = 1): Promise<Decision> {
    return this.decide(key, cost, false);
  }

  /** Refills `key`'s bucket (e.g. after a successful login). */
  reset(key: string): Promise<void> {
    try {
      return this.store.reset(v.key(key));
    } catch (error) {
      return Promise.reject(error as Error);
    }
  }

  private decide(key: string, cost: unknown, commit: boolean): Promise<Decision> {
    // A bad argument rejects, as the lockers' calls do, rather than throwing before a promise exists: code that only
    // handles the promise's failure (`.catch`, a rejected `await`) sees it either way.
    try {
      return this.store.take(v.key(key), this.cost(cost), commit);
    } catch (error) {
      return Promise.reject(error as Error);
    }
  }

  private cost(cost: unknown): number {
    const c = v.positiveNumber('cost', cost);
    if (c > this.capacity) throw new RangeError(`cost ${c} exceeds the capacity ${this.capacity}: it could never be granted`);
    return c;
  }
}

/**
 * For the middleware: the store of a bucket made by this copy of the module (undefined for any other bucket), whose
 * `take` can record an admitting take in the request's home so that `giveBack` can undo it. Its callers validate key
 * and cost as `take` does.
 */
export function storeOf(bucket: object): BucketStore | undefined {
  return STORES.get(bucket);
}

/** Whether `bucket` is a TokenBucket of any copy of this module, or something built on one (a subclass, a Proxy). */
export function isTokenBucket(bucket: object): boolean {
  return (bucket as { [BUCKET_BRAND]?: unknown })[BUCKET_BRAND] === true;
}

Object.defineProperty(TokenBucket.prototype, BUCKET_BRAND, { value: true });
