// What a rate limiter does while its Redis is failing: a circuit per bucket that stops sending requests to a Redis that
// just failed, hands them to the onStoreError policy (with a per-process fallback bucket for 'memory'), and goes back
// to Redis as soon as it answers: at once on the client's 'ready' event, or when a background probe succeeds.
import { TokenBucket } from '../rate-limit/token-bucket.js';
import { onNext, type EventSource } from '../redis/events.js';
import type { Decision, RedisClient } from '../types.js';

/** What the middleware needs of a bucket; a {@link TokenBucket} from either module format fits. */
export interface BucketLike {
  readonly capacity: number;
  readonly rate: number;
  readonly redis?: RedisClient | undefined;
  take(key: string, cost?: number): Promise<Decision>;
  peek(key: string, cost?: number): Promise<Decision>;
}

/** What a rate limiter's `onStoreState` hook hears: its Redis went down (with the failure), or answers again. */
export interface StoreStateEvent {
  /** `'down'`: a call failed, and requests follow `onStoreError` until Redis answers; `'up'`: it answers again. */
  readonly state: 'down' | 'up';
  /** The failure that took it down (a `RateLimitUnavailableError`, its `cause` kept); only with `'down'`. */
  readonly error?: unknown;
}

/** Ms between background probes of a Redis that failed without disconnecting (hung, paused, erroring scripts). */
export const PROBE_INTERVAL_MS = 500;
// A probe is a take, on the key whose take failed last, of the least cost there is: it costs that bucket a microsecond
// of refill (the least any take costs). A take rather than a peek, so that it writes as the requests do: a Redis that
// answers reads but refuses writes (out of memory, a replica after a failover, an ACL) is still down. On that key, so
// that it asks the node that failed: on a Cluster with one master down, a key of another master would answer.
const PROBE_COST = Number.MIN_VALUE;

/** True for the error a bucket rejects with when its store failed (checked by code: module copies differ). */
export function isStoreError(error: unknown): boolean {
  return (error as { code?: unknown } | null)?.code === 'RATE_LIMIT_UNAVAILABLE';
}

// The replies of the bucket scripts for a key that holds something else (bucket.lua.ts), kept as the error's cause.
const KEY_FAULT = /^(?:WRONGTYPE|ERR hasp: a token bucket key)/;

/** True for a store error that is the key's own (its data is not a bucket): Redis answered, and fails that key alone. */
export function isKeyFault(error: unknown): boolean {
  const cause = (error as { cause?: unknown }).cause;
  return cause instanceof Error && KEY_FAULT.test(cause.message);
}

/** The circuit of one bucket; shared by every middleware using that bucket. */
export class StoreGuard {
  /** True while Redis is considered down: requests go to the onStoreError policy without trying Redis. */
  private down = false;
  private probing = false;
  // On the monotonic clock: a wall clock stepped back (NTP) would otherwise put off every probe by the size of the step.
  private nextProbe = 0;
  private listening = false;
  private probeKey = '';
  private fallbackBucket: TokenBucket | undefined;
  // Hooks of the limiters on this bucket: told once per outage, not once per failed request.
  private readonly listeners = new Set<(event: StoreStateEvent) => void>();
  private readonly onReady = (): void => {
    this.listening = false;
    this.up();
  };

  constructor(private readonly bucket: BucketLike) {}

  /** Whether to send this request to Redis. While down, may start a background probe (at most one at a time). */
  usable(): boolean {
    if (!this.down) return true;
    if (!this.probing && performance.now() >= this.nextProbe) this.probe();
    return false;
  }

  /** Adds a hook told when the store goes down and comes back (see {@link StoreStateEvent}). */
  listen(hook: (event: StoreStateEvent) => void): void {
    this.listeners.add(hook);
  }

  /** Records a failed take of `key`: opens the circuit until Redis answers again (a probe on that key succeeds). */
  failed(key: string, error?: unknown): void {
    this.probeKey = key;
    if (!this.down) {
      this.down = true;
      this.nextProbe = performance.now() + PROBE_INTERVAL_MS;
      this.tell({ state: 'down', error });
    }
    const redis = this.bucket.redis as EventSource | undefined;
    if (!this.listening && typeof redis?.once === 'function') {
      // A reconnected client emits 'ready': that is the earliest moment Redis answers again. (One listener per client,
      // shared by the circuits of every bucket on it.)
      this.listening = true;
      onNext(redis, 'ready', this.onReady);
    }
  }

  /** The per-process bucket that stands in while Redis is down ('memory' policy); same capacity and rate. */
  get fallback(): TokenBucket {
    this.fallbackBucket ??= new TokenBucket({ capacity: this.bucket.capacity, rate: this.bucket.rate });
    return this.fallbackBucket;
  }

  /** Seconds until the next probe: the Retry-After of a 503 under the 'closed' policy. */
  retryAfter(): number {
    return Math.max(1, Math.ceil((this.nextProbe - performance.now()) / 1_000));
  }

  private probe(): void {
    this.probing = true;
    this.bucket.take(this.probeKey, PROBE_COST).then(
      () => {
        this.probing = false;
        this.up();
      },
      (error: unknown) => {
        this.probing = false;
        // The probe's key holds something else (it failed last by timing out): Redis answered all the same.
        if (isKeyFault(error)) this.up();
        else this.nextProbe = performance.now() + PROBE_INTERVAL_MS;
      },
    );
  }

  private up(): void {
    if (!this.down) return;
    this.down = false;
    this.tell({ state: 'up' });
  }

  private tell(event: StoreStateEvent): void {
    for (const hook of this.listeners) {
      try {
        hook(event);
      } catch {
        // A throwing hook must not fail the request that noticed the outage, nor keep the other hooks from hearing it.
      }
    }
  }
}

const guards = new WeakMap<BucketLike, StoreGuard>();

/** The circuit of `bucket`, created on first use; undefined for in-memory buckets, which cannot fail. */
export function storeGuard(bucket: BucketLike): StoreGuard | undefined {
  if (bucket.redis === undefined) return undefined;
  let guard = guards.get(bucket);
  if (!guard) {
    guard = new StoreGuard(bucket);
    guards.set(bucket, guard);
  }
  return guard;
}
