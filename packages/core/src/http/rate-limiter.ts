// rateLimit(): option resolution (once, at construction) and the per-request decision, shared by the Express and Koa
// adapters, which only read the request's key and write the result.
import { assertClient } from '../lock/redis-lock.js';
import { parseRate } from '../rate-limit/rate.js';
import { RedisBucketStore, Taken, type BucketStore, type TakeHome } from '../rate-limit/bucket-store.js';
import { isTokenBucket, storeOf, TokenBucket } from '../rate-limit/token-bucket.js';
import { encodePrefixPart } from '../redis/keys.js';
import type { Decision, RedisClient } from '../types.js';
import * as v from '../util/validate.js';
import { rateLimitedError, rateLimitUnavailableError, type MiddlewareHttpError } from './errors.js';
import { appendListMember, POLICY_FIELD, RATELIMIT_FIELD, RateLimitFields, RETRY_AFTER_FIELD } from './fields.js';
import { callCost, callKey, type CostFunction, type KeyFunction } from './inputs.js';
import { isKeyFault, isStoreError, storeGuard, type BucketLike, type StoreGuard, type StoreStateEvent } from './store-guard.js';
import { checkOptionNames, optionErrors } from './options.js';
import { warnOnce } from '../util/warn.js';

/** What to do when the bucket's Redis fails. */
export type StoreErrorPolicy = 'memory' | 'open' | 'closed';

/** Options of `rateLimit()` shared by both adapters; `Arg` is Express's `req` or Koa's `ctx`. */
export interface RateLimitBaseOptions<Arg> {
  /** Bucket size (> 0): the largest burst. Required unless `bucket` is given. */
  capacity?: number | undefined;
  /** Refill rate: tokens per second, or `'2/s'`, `'30/min'`, `'100/h'`, `'1000/d'`. Required unless `bucket` is given. */
  rate?: number | string | undefined;
  /**
   * Where the buckets live: an ioredis `Redis` or `Cluster`.
   * @default none: in this process's memory
   */
  redis?: RedisClient | undefined;
  /**
   * A prepared `TokenBucket` (e.g. shared between routes), instead of `capacity`, `rate` and `redis` (giving any of
   * them as well throws).
   * @default none
   */
  bucket?: BucketLike | undefined;
  /**
   * The bucket key: a string, or a function of the request (may be async). `undefined` skips limiting for that request;
   * a function that throws or returns anything but a non-empty string or `undefined` is a 500 (code `INVALID_KEY`)
   * through the app's error handling, and nothing is taken.
   * @default the client IP as the framework reports it (Express `req.ip`, which follows `trust proxy`; Koa `ctx.ip`,
   *   which follows `app.proxy`), IPv4-mapped IPv6 as IPv4, other IPv6 grouped by /64; without a trusted proxy,
   *   `X-Forwarded-For` and `Forwarded` are ignored
   */
  key?: string | KeyFunction<Arg> | undefined;
  /**
   * Tokens one request takes: a number, or a function of the request (may be async).
   * @default 1
   */
  cost?: number | CostFunction<Arg> | undefined;
  /**
   * Send the `RateLimit-Policy` and `RateLimit` response fields.
   * @default true
   */
  headers?: boolean | undefined;
  /**
   * The policy name in those fields (printable ASCII). On Redis, buckets built from `capacity`/`rate` are stored under
   * it (`hasp:tb:<policy>:{<key>}:<h>`, `h` a hash of the capacity and rate), so limiters with the same policy name on the same Redis share a budget per key;
   * give each limiter its own name unless that is what you want. In memory every limiter has its own buckets whatever
   * its name: to share one, pass the same `bucket`.
   * @default 'default'
   */
  policy?: string | undefined;
  /**
   * When Redis fails (an error, or no answer within the bucket's timeout, 2 s): `'memory'` takes from a per-process
   * bucket of the same capacity and rate; `'open'` lets requests through unlimited (no RateLimit fields); `'closed'`
   * answers 503 (code `RATE_LIMIT_UNAVAILABLE`, `Retry-After`). After a failure the limiter stops asking Redis, so
   * requests do not each wait out the timeout, and goes back to it as soon as it answers: at the client's `'ready'`
   * event after a reconnect, or when a probe (every 500 ms while requests come in: a take of the least cost on the key
   * that failed last, so that it writes as requests do and asks the same node) succeeds. On a Cluster, each master
   * has its own circuit: only the failing master's keys follow the policy. No restart needed. A
   * bucket key that holds something else (another type, or no number) fails its own requests the same way, without
   * counting as an outage: the other keys keep going to Redis.
   * @default 'memory'
   */
  onStoreError?: StoreErrorPolicy | undefined;
  /**
   * Told when the bucket's Redis goes down (`{ state: 'down', error }`: a call failed, and requests now follow
   * `onStoreError`) and when it answers again (`{ state: 'up' }`): once per outage, however many requests meet it, so
   * it can log or count without flooding. A hook that throws is ignored. Never called for in-memory buckets. Limiters
   * sharing a `bucket` and given the same function tell it once (within one build of @hasp/core: the ESM and CommonJS
   * builds in one app tell it once each); a limiter that is dropped (one made per tenant, say)
   * takes its hook with it.
   * @default none
   */
  onStoreState?: ((event: StoreStateEvent) => void) | undefined;
  /**
   * Give this limiter's tokens back when a later hasp limiter or `withLock` refuses the request (exactly, or not at
   * all when the bucket was taken from since). `false` makes every request it admits count, refused later or not: a
   * flood guard (a limit per client IP in front of the others) must, or a client sending only requests that a later
   * limiter refuses (429s on a phone number at its limit, 423s on a held order) is not bounded by it.
   * @default true
   */
  giveBack?: boolean | undefined;
}

/**
 * For a request that is not served after all: gives back the tokens that hasp rate limiters recorded in `home` for it
 * (in either adapter, any bucket made by hasp, on Redis or in memory), so that a request refused by one policy, or by
 * `withLock` (423, 503, 499, 500), costs nothing in the others (but those made with `giveBack: false`, which record
 * nothing). A limiter that cannot decide (a 500 or 503 from
 * {@link RateLimiter.check}) has done so before rejecting. A take stays spent when its bucket has been taken from since
 * (removing it from under a later take could admit more than the bucket allows), or when its store fails. Undefined
 * when there is nothing to give back; otherwise resolves (never rejects) once every store has answered.
 * @param home - the object the request's limiters were given as `home` in {@link RateLimiter.check}
 */
export function giveBackTakes(home: object | undefined): Promise<void> | undefined {
  const newest = home === undefined ? undefined : Taken.leave(home as TakeHome);
  if (newest === undefined) return undefined;
  const pending: Promise<unknown>[] = [];
  for (let t: Taken | undefined = newest; t !== undefined; t = t.prev) {
    pending.push(t.store.giveBack(t.key, t.cost, t.stored).catch(() => false));
  }
  return Promise.all(pending).then(() => undefined);
}

/** Where the adapters write the fields: a Node `ServerResponse` (Express's `res`, Koa's `ctx.res`). */
export interface HeaderTarget {
  /** True once the headers went out (an earlier middleware answered, and passed the request on all the same). */
  readonly headersSent?: boolean;
  getHeader(name: string): unknown;
  setHeader(name: string, value: string): unknown;
}

const NOT_LIMITED: Promise<undefined> = Promise.resolve(undefined);
const OPTIONS = ['capacity', 'rate', 'redis', 'bucket', 'key', 'cost', 'headers', 'policy', 'onStoreError', 'onStoreState', 'giveBack', 'handler'] as const;
const POLICIES: readonly StoreErrorPolicy[] = ['memory', 'open', 'closed'];
/** Prefix of the Redis keys of buckets the middleware builds itself: `hasp:tb:<policy>:{<key>}:<h>`. */
export const MIDDLEWARE_BUCKET_PREFIX = 'hasp:tb:';

/**
 * A rate limiter as the adapters use it: everything resolved and validated once; {@link RateLimiter.check} per request.
 * @typeParam Arg - what key and cost functions receive (Express `req`, Koa `ctx`)
 * @typeParam H - the adapter's `handler` signature
 */
export class RateLimiter<Arg, H = never> {
  /** Whether to send the RateLimit fields. */
  readonly headers: boolean;
  /** The custom response for a denied request, if any. */
  readonly handler: H | undefined;
  /** The bucket every request of this limiter takes from. */
  readonly bucket: BucketLike;
  /** The serializer of this limiter's fields (policy member cached). */
  readonly fields: RateLimitFields;
  /** The store-error policy. */
  readonly onStoreError: StoreErrorPolicy;
  private readonly where: string;
  private readonly keyFn: KeyFunction<Arg> | undefined;
  private readonly defaultKey: (arg: Arg) => string | undefined;
  private readonly staticKey: string | undefined;
  private readonly costFn: CostFunction<Arg> | undefined;
  private readonly cost: number;
  private readonly guard: StoreGuard | undefined;
  private readonly stateListener: { readonly onStoreState: (event: StoreStateEvent) => void } | undefined;
  /** See {@link RateLimitBaseOptions.giveBack}: false records no take on the request's home. */
  private readonly giveBack: boolean;
  private readonly store: BucketStore | undefined;

  /**
   * @param options - the user's options
   * @param defaultKey - the adapter's client-IP key
   * @param where - the function name for error messages
   * @throws TypeError or RangeError naming the option when an option is missing or invalid
   */
  constructor(options: RateLimitBaseOptions<Arg> & { handler?: H }, defaultKey: (arg: Arg) => string | undefined, where = 'rateLimit') {
    this.where = where;
    this.defaultKey = defaultKey;
    const o = optionErrors(where, () => {
      if (options === null || typeof options !== 'object') throw new TypeError('options must be an object');
      const given = v.definedOnly(options);
      checkOptionNames(given, OPTIONS);
      return given;
    });
    const resolved = optionErrors(where, () => {
      let bucket: BucketLike;
      const policy = o.policy === undefined ? 'default' : o.policy;
      if (o.bucket !== undefined) {
        for (const name of ['capacity', 'rate', 'redis'] as const) {
          if (o[name] !== undefined) throw new TypeError(`pass either bucket or ${name}, not both (the bucket has its own)`);
        }
        bucket = checkBucket(o.bucket);
      } else {
        if (o.capacity === undefined) throw new TypeError('capacity is required (or pass a prepared bucket)');
        if (o.rate === undefined) throw new TypeError('rate is required (or pass a prepared bucket)');
        const capacity = v.positiveNumber('capacity', o.capacity);
        const rate = parseRate(o.rate, 'rate');
        if (o.redis !== undefined) assertClient('redis', o.redis);
        bucket = new TokenBucket({
          capacity,
          rate,
          redis: o.redis,
          // Braces escaped (injectively): a policy such as 'login{v2}' must not open a hash tag in the prefix, which
          // TokenBucket refuses, nor let one policy's names collide with another's.
          prefix: `${MIDDLEWARE_BUCKET_PREFIX}${encodePrefixPart(v.string('policy', policy))}:`,
        });
      }
      const fields = new RateLimitFields(policy, bucket.capacity, bucket.rate);
      let keyFn: KeyFunction<Arg> | undefined;
      let staticKey: string | undefined;
      if (typeof o.key === 'function') keyFn = o.key;
      else if (typeof o.key === 'string' && o.key.length > 0) staticKey = o.key;
      else if (o.key !== undefined) throw new TypeError(`key must be a non-empty string or a function, got ${v.describe(o.key)}`);
      let costFn: CostFunction<Arg> | undefined;
      let cost = 1;
      if (typeof o.cost === 'function') costFn = o.cost;
      else if (o.cost !== undefined) {
        if (typeof o.cost !== 'number') throw new TypeError(`cost must be a number or a function, got ${v.describe(o.cost)}`);
        cost = v.positiveNumber('cost', o.cost);
        if (cost > bucket.capacity) throw new RangeError(`cost ${cost} exceeds the capacity ${bucket.capacity}: it could never be granted`);
      } else if (bucket.capacity < 1) {
        throw new RangeError(`capacity ${bucket.capacity} is below the default cost 1: set cost too`);
      }
      const onStoreError = o.onStoreError === undefined ? 'memory' : o.onStoreError;
      if (!POLICIES.includes(onStoreError)) {
        throw new RangeError(`onStoreError must be one of 'memory', 'open', 'closed', got ${v.describe(onStoreError)}`);
      }
      return {
        bucket,
        fields,
        keyFn,
        staticKey,
        costFn,
        cost,
        onStoreError,
        onStoreState: o.onStoreState === undefined ? undefined : v.func<(e: StoreStateEvent) => void>('onStoreState', o.onStoreState),
        headers: o.headers === undefined ? true : v.boolean('headers', o.headers),
        giveBack: o.giveBack === undefined ? true : v.boolean('giveBack', o.giveBack),
        handler: o.handler === undefined ? undefined : v.func<H>('handler', o.handler),
      };
    });
    this.bucket = resolved.bucket;
    this.fields = resolved.fields;
    this.keyFn = resolved.keyFn;
    this.staticKey = resolved.staticKey;
    this.costFn = resolved.costFn;
    this.cost = resolved.cost;
    this.onStoreError = resolved.onStoreError;
    this.headers = resolved.headers;
    this.handler = resolved.handler;
    this.giveBack = resolved.giveBack;
    const own = storeOf(this.bucket);
    // A subclass's own take() is what its user asked for: taken through it (and nothing given back).
    this.store = own !== undefined && (this.bucket as { take?: unknown }).take === TokenBucket.prototype.take ? own : undefined;
    if (this.store === undefined && this.giveBack) warnIfNoGiveBack(this.bucket);
    const store = this.store;
    this.guard = storeGuard(this.bucket, store instanceof RedisBucketStore ? (key) => store.name(key) : undefined);
    if (resolved.onStoreState !== undefined && this.guard !== undefined) {
      // Kept here, held weakly by the shared guard: the hook goes when this limiter does.
      this.stateListener = { onStoreState: resolved.onStoreState };
      this.guard.listen(this.stateListener);
    }
  }

  /**
   * Decides one request: reads its key and cost, takes from the bucket, and applies `onStoreError` when Redis fails.
   * Resolves the decision (allowed or not), or `undefined` when the request is not limited (its key is `undefined`, or
   * Redis failed under `'open'`).
   * @param arg - what the key and cost functions receive (Express `req`, Koa `ctx`)
   * @param home - an object that lives as long as the request and that the framework does not read (Express
   *   `res.locals`, Koa `ctx.state`): the take is recorded there, so that {@link giveBackTakes} can give it
   *   back if a later limiter refuses the request. Without it, nothing is recorded. Not `req` or `ctx` themselves: a
   *   property added there changes their shape under the framework's own code, which slowed every request (measured).
   * @throws a 500 `http-errors` error (`INVALID_KEY`/`INVALID_COST`) for a bad key or cost, before anything is written;
   *   a 503 (`RATE_LIMIT_UNAVAILABLE`) when Redis failed under `'closed'`; either after giving back the takes recorded
   *   in `home` (see {@link giveBackTakes})
   */
  check(arg: Arg, home?: object): Promise<Decision | undefined> {
    // Plain promise chains rather than async functions: this runs for every request, and each async layer costs a few
    // promises and microtask turns. Synchronous throws (a key or cost function's 500) become rejections.
    try {
      const key = this.keyFn !== undefined ? callKey(this.where, this.keyFn, arg) : (this.staticKey ?? this.defaultKey(arg));
      if (typeof key === 'object') return key.then((k) => this.withKey(k, arg, home), (e: unknown) => this.failed(home, e));
      return this.withKey(key, arg, home);
    } catch (error) {
      return this.failed(home, error);
    }
  }

  private withKey(key: string | undefined, arg: Arg, home: object | undefined): Promise<Decision | undefined> {
    if (key === undefined) return NOT_LIMITED;
    if (this.costFn === undefined) return this.take(key, this.cost, home);
    let c: number | Promise<number>;
    try {
      c = callCost(this.where, this.costFn, arg, this.bucket.capacity);
    } catch (error) {
      return this.failed(home, error);
    }
    return typeof c === 'number' ? this.take(key, c, home) : c.then((cost) => this.take(key, cost, home), (e: unknown) => this.failed(home, e));
  }

  // The request fails here (a bad key or cost, or Redis down under 'closed'): it is not served, so it costs nothing in
  // the limiters before this one either.
  private failed(home: object | undefined, error: unknown): Promise<never> {
    const back = giveBackTakes(home);
    return back === undefined ? Promise.reject(error) : back.then(() => Promise.reject(error));
  }

  private take(key: string, cost: number, home: object | undefined): Promise<Decision | undefined> {
    const guard = this.guard;
    if (guard === undefined) return this.takeFrom(this.bucket, this.store, key, cost, home);
    if (!guard.usable(key)) return this.degraded(guard, key, cost, undefined, home);
    return this.takeFrom(this.bucket, this.store, key, cost, home).then(undefined, (error: unknown) => {
      if (!isStoreError(error)) throw error;
      // A key's own data (another type, or no number, under the bucket's name) fails that key alone: Redis still
      // answers the others, so only this request follows onStoreError.
      if (!isKeyFault(error)) guard.failed(key, error);
      return this.degraded(guard, key, cost, error, home);
    });
  }

  // Through the bucket's store when hasp made the bucket, so that the take is recorded on the request (see
  // giveBackTakes), unless this limiter's takes always count (giveBack: false); key and cost are valid here (callKey,
  // callCost, the constructor).
  private takeFrom(bucket: BucketLike, store: BucketStore | undefined, key: string, cost: number, home: object | undefined): Promise<Decision> {
    if (store === undefined || home === undefined || !this.giveBack) return bucket.take(key, cost);
    return store.take(key, cost, true, home as TakeHome);
  }

  /**
   * Writes `RateLimit-Policy` and `RateLimit` (appended to members other limiters wrote) and, for a denial,
   * `Retry-After`. Call only when {@link RateLimiter.headers} is true, or for a denial. Writes nothing once the headers
   * have been sent: an earlier middleware that answered and passed the request on is no reason to fail it.
   */
  setHeaders(res: HeaderTarget, d: Decision): void {
    if (res.headersSent === true) return;
    if (this.headers) {
      res.setHeader(POLICY_FIELD, appendListMember(res.getHeader(POLICY_FIELD), this.fields.policy));
      res.setHeader(RATELIMIT_FIELD, appendListMember(res.getHeader(RATELIMIT_FIELD), this.fields.rateLimit(d)));
    }
    if (!d.allowed) res.setHeader(RETRY_AFTER_FIELD, String(this.fields.retryAfter(d)));
  }

  /**
   * The 429 for a denied decision, after {@link RateLimiter.setHeaders}: its `headers` repeat what is on the response
   * (Koa's default error handler sends only `err.headers`).
   */
  deniedError(d: Decision, res: HeaderTarget): MiddlewareHttpError {
    const headers: Record<string, string> = { [RETRY_AFTER_FIELD]: String(this.fields.retryAfter(d)) };
    if (this.headers) {
      headers[POLICY_FIELD] = String(res.getHeader(POLICY_FIELD) ?? this.fields.policy);
      headers[RATELIMIT_FIELD] = String(res.getHeader(RATELIMIT_FIELD) ?? this.fields.rateLimit(d));
    }
    return rateLimitedError(d, headers);
  }

  private degraded(guard: StoreGuard, key: string, cost: number, cause: unknown, home: object | undefined): Promise<Decision | undefined> {
    switch (this.onStoreError) {
      case 'memory':
        return this.takeFrom(guard.fallback, storeOf(guard.fallback), key, cost, home);
      case 'open':
        return Promise.resolve(undefined);
      default:
        // While the circuit is open no call is made: the cause is the failure that keeps it open.
        return this.failed(home, rateLimitUnavailableError(guard.retryAfter(key), cause ?? guard.failure(key) ?? new Error('rate-limit store is down')));
    }
  }
}

/**
 * Warns once per process when a limiter gets a hasp TokenBucket whose store it cannot reach: one made by the other
 * build of @hasp/core than its own (the app loads both the ESM and the CommonJS build), a Proxy or other wrapper around
 * one, or a subclass that overrides take(). Such a bucket works through its take(), but what it took for a request that
 * a later limiter refuses cannot be given back (and on a Cluster it shares one circuit for all masters).
 */
function warnIfNoGiveBack(bucket: object): void {
  if (!isTokenBucket(bucket)) return;
  warnOnce(
    'HASP_BUCKET_NO_GIVE_BACK',
    'hasp: a rate limiter got a TokenBucket it can only call take() on: one made by the other build of @hasp/core (this process loads both its ESM and its CommonJS build; load it the way the middleware does), a Proxy or other wrapper around one, or a subclass that overrides take(). Tokens it takes for requests a later limiter refuses are not given back',
  );
}

function checkBucket(value: unknown): BucketLike {
  const b = value as Partial<BucketLike> | null;
  if (
    typeof b !== 'object' ||
    b === null ||
    typeof b.take !== 'function' ||
    typeof b.peek !== 'function' ||
    typeof b.capacity !== 'number' ||
    typeof b.rate !== 'number'
  ) {
    throw new TypeError(`bucket must be a TokenBucket, got ${v.describe(value)}`);
  }
  return b as BucketLike;
}
