// What a rate limiter does while its Redis is failing: a circuit per bucket (per master on a Cluster) that stops sending
// requests to a Redis that just failed, hands them to the onStoreError policy (with a per-process fallback bucket for
// 'memory'), and goes back to Redis as soon as it answers: at once on the client's 'ready' event, or when a background
// probe succeeds.
import type { RateLimitUnavailableError } from '../errors.js';
import { TokenBucket } from '../rate-limit/token-bucket.js';
import { onNext, type EventSource } from '../redis/events.js';
import { hashSlot } from '../redis/keys.js';
import type { Decision, RedisClient } from '../types.js';
import { ignoreRejection } from '../util/abort.js';
import { realPerfNow } from '../util/real-timers.js';

/** What the middleware needs of a bucket; a {@link TokenBucket} from either module format fits. */
export interface BucketLike {
  readonly capacity: number;
  readonly rate: number;
  readonly redis?: RedisClient | undefined;
  take(key: string, cost?: number): Promise<Decision>;
  peek(key: string, cost?: number): Promise<Decision>;
}

/**
 * What a rate limiter's `onStoreState` hook hears: its Redis went down (with the failure), or answers again.
 * `state: 'down'`: a call failed, and requests follow `onStoreError` until Redis answers; `error` is that failure, a
 * {@link RateLimitUnavailableError} with the underlying error as its `cause`. `state: 'up'`: Redis answers again.
 */
export type StoreStateEvent =
  | { readonly state: 'down'; readonly error: RateLimitUnavailableError }
  | { readonly state: 'up'; readonly error?: undefined };

/** Ms between background probes of a Redis that failed without disconnecting (hung, paused, erroring scripts). */
export const PROBE_INTERVAL_MS = 500;
// A probe is a take, on the key whose take failed last, of the least cost there is: it costs that bucket a microsecond
// of refill (the least any take costs). A take rather than a peek, so that it writes as the requests do: a Redis that
// answers reads but refuses writes (out of memory, a replica after a failover, an ACL) is still down. On that key, so
// that it asks the node that failed: on a Cluster with one master down, a key of another master would answer.
const PROBE_COST = Number.MIN_VALUE;

/** True for the error a bucket rejects with when its store failed (checked by code: module copies differ). */
export function isStoreError(error: unknown): error is RateLimitUnavailableError {
  return (error as { code?: unknown } | null)?.code === 'RATE_LIMIT_UNAVAILABLE';
}

// The replies of the bucket scripts for a key that holds something else (bucket.lua.ts), kept as the error's cause.
const KEY_FAULT = /^(?:WRONGTYPE|ERR hasp: a token bucket key)/;

/** True for a store error that is the key's own (its data is not a bucket): Redis answered, and fails that key alone. */
export function isKeyFault(error: unknown): boolean {
  const cause = (error as { cause?: unknown }).cause;
  return cause instanceof Error && KEY_FAULT.test(cause.message);
}

/** Slack past a full refill before the fallback is dropped, for the wall clock its buckets count on. */
const FORGET_SLACK_MS = 1_000;
const MAX_TIMER_MS = 2 ** 31 - 1;
const SWEEP_MIN = 64;

/** One open circuit: requests it covers follow the policy until a probe (or the client's 'ready') closes it. */
interface Circuit {
  probing: boolean;
  // On the monotonic clock: a wall clock stepped back (NTP) would otherwise put off every probe by the size of the step.
  nextProbe: number;
  /** The key whose take failed last here: probes take from it, so that they ask the node that failed. */
  probeKey: string;
  /** The last failure here (a take's or a probe's): the cause of the 503s the circuit answers meanwhile. */
  error: RateLimitUnavailableError;
}

/**
 * The circuits of one bucket; shared by every middleware using that bucket. On a standalone client there is one; on a
 * Cluster, one per master (as the client's slot map has it when a take fails), so that a master that fails sends only
 * its own keys to the policy while the other masters keep answering theirs.
 */
export class StoreGuard {
  /** Open circuits, by master ('host:port'; '' for a standalone client, or a Cluster whose slots are not known yet). */
  private readonly open = new Map<string, Circuit>();
  private listening = false;
  private fallbackBucket: TokenBucket | undefined;
  private forgetTimer: NodeJS.Timeout | undefined;
  // Hooks of the limiters on this bucket: told once per outage (from the first circuit opened to the last one closed),
  // not once per failed request. Held weakly, through a holder each limiter keeps: a shared bucket outlives limiters
  // made per tenant or per route and dropped, and would otherwise keep every one of their hooks (and call them all).
  private readonly listeners = new Set<WeakRef<{ readonly onStoreState: (event: StoreStateEvent) => void }>>();
  // listen() sweeps out the holders of dropped limiters when the set reaches this size.
  private sweepAt = SWEEP_MIN;
  private readonly onReady = (): void => {
    this.listening = false;
    if (this.open.size === 0) return;
    this.open.clear();
    this.wentUp();
  };
  // The master that serves a key now, from a Cluster client's slot map and the Redis name of the key's bucket (with the
  // client's keyPrefix). Undefined on a standalone client, or for a bucket hasp did not make.
  private readonly masterOf: ((key: string) => string) | undefined;

  constructor(
    private readonly bucket: BucketLike,
    nameOf?: (key: string) => string,
  ) {
    const client = bucket.redis as { isCluster?: unknown; slots?: unknown; options?: { keyPrefix?: unknown } } | undefined;
    if (client?.isCluster === true && Array.isArray(client.slots) && nameOf !== undefined) {
      const keyPrefix = typeof client.options?.keyPrefix === 'string' ? client.options.keyPrefix : '';
      // Read at each call: ioredis updates the map as slots move.
      this.masterOf = (key) => (client.slots as (string[] | undefined)[])[hashSlot(keyPrefix + nameOf(key))]?.[0] ?? '';
    }
  }

  /**
   * Whether to send a take of `key` to Redis. While circuits are open, starts the probes that are due (one at a time
   * per circuit): every circuit's, not only `key`'s, since after a failover no key maps to the failed master any more
   * and its circuit would otherwise stay open, unheard, for good. A probe's take goes wherever its key lives now.
   */
  usable(key: string): boolean {
    if (this.open.size === 0) return true;
    const now = realPerfNow();
    for (const [id, c] of this.open) if (!c.probing && now >= c.nextProbe) this.probe(id, c);
    return !this.open.has(this.circuitOf(key));
  }

  /**
   * Adds a hook told when the store goes down and comes back (see {@link StoreStateEvent}), for as long as the caller
   * keeps `listener` (what a limiter keeps for its hook) reachable.
   */
  listen(listener: { readonly onStoreState: (event: StoreStateEvent) => void }): void {
    this.listeners.add(new WeakRef(listener));
    if (this.listeners.size < this.sweepAt) return;
    for (const ref of this.listeners) if (ref.deref() === undefined) this.listeners.delete(ref);
    this.sweepAt = Math.max(SWEEP_MIN, 2 * this.listeners.size);
  }

  /** Records a failed take of `key`: opens its circuit until Redis answers again (a probe on that key succeeds). */
  failed(key: string, error: RateLimitUnavailableError): void {
    const id = this.circuitOf(key);
    const c = this.open.get(id);
    if (c !== undefined) {
      c.probeKey = key;
      c.error = error;
    } else {
      this.open.set(id, { probing: false, nextProbe: realPerfNow() + PROBE_INTERVAL_MS, probeKey: key, error });
      if (this.open.size === 1) {
        if (this.forgetTimer !== undefined) clearTimeout(this.forgetTimer);
        this.forgetTimer = undefined;
        this.tell({ state: 'down', error });
      }
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

  /** The last failure of `key`'s circuit, while it is open: why Redis is not asked. */
  failure(key: string): RateLimitUnavailableError | undefined {
    return this.open.get(this.circuitOf(key))?.error;
  }

  /** Seconds until the next probe of `key`'s circuit: the Retry-After of a 503 under the 'closed' policy. */
  retryAfter(key: string): number {
    const c = this.open.get(this.circuitOf(key));
    return c === undefined ? 1 : Math.max(1, Math.ceil((c.nextProbe - realPerfNow()) / 1_000));
  }

  private circuitOf(key: string): string {
    return this.masterOf?.(key) ?? '';
  }

  private probe(id: string, c: Circuit): void {
    c.probing = true;
    this.bucket.take(c.probeKey, PROBE_COST).then(
      () => {
        c.probing = false;
        this.close(id, c);
      },
      (error: unknown) => {
        c.probing = false;
        // The probe's key holds something else (it failed last by timing out): Redis answered all the same.
        if (isKeyFault(error)) this.close(id, c);
        else {
          c.nextProbe = realPerfNow() + PROBE_INTERVAL_MS;
          if (isStoreError(error)) c.error = error;
        }
      },
    );
  }

  private close(id: string, c: Circuit): void {
    if (this.open.get(id) !== c) return;
    this.open.delete(id);
    if (this.open.size === 0) this.wentUp();
  }

  /**
   * The last circuit closed. Nothing takes from the fallback until the next outage, so its buckets only refill: once
   * every one is full again it holds nothing a fresh one would not, and is dropped. Kept, it would hold every key of
   * the outage (200 000 client IPs: 17 MB) until the next one, since its buckets are swept only by its own takes.
   */
  private wentUp(): void {
    this.tell({ state: 'up' });
    if (this.fallbackBucket === undefined) return;
    this.forgetAfter(Math.ceil((this.bucket.capacity / this.bucket.rate) * 1_000) + FORGET_SLACK_MS);
  }

  // A timer waits at most 2^31 − 1 ms (about 24.8 days; Node runs a longer one at once): a longer refill ("5/30d") is
  // waited out in steps.
  private forgetAfter(ms: number): void {
    this.forgetTimer = setTimeout(() => {
      this.forgetTimer = undefined;
      if (ms > MAX_TIMER_MS) this.forgetAfter(ms - MAX_TIMER_MS);
      else if (this.open.size === 0) this.fallbackBucket = undefined;
    }, Math.min(ms, MAX_TIMER_MS));
    this.forgetTimer.unref();
  }

  private tell(event: StoreStateEvent): void {
    // Two limiters given the same hook tell it once.
    const told = new Set<(event: StoreStateEvent) => void>();
    for (const ref of this.listeners) {
      const hook = ref.deref()?.onStoreState;
      if (hook === undefined) {
        this.listeners.delete(ref);
        continue;
      }
      if (told.has(hook)) continue;
      told.add(hook);
      try {
        ignoreRejection(hook(event));
      } catch {
        // A throwing hook must not fail the request that noticed the outage, nor keep the other hooks from hearing it.
      }
    }
  }
}

const guards = new WeakMap<BucketLike, StoreGuard>();

/**
 * The circuits of `bucket`, created on first use; undefined for in-memory buckets, which cannot fail. `nameOf`: the
 * Redis name of a key's bucket, which a Cluster's circuits need (a bucket hasp made); without it, one circuit.
 */
export function storeGuard(bucket: BucketLike, nameOf?: (key: string) => string): StoreGuard | undefined {
  if (bucket.redis === undefined) return undefined;
  let guard = guards.get(bucket);
  if (!guard) {
    guard = new StoreGuard(bucket, nameOf);
    guards.set(bucket, guard);
  }
  return guard;
}
