// Token-bucket arithmetic as GCRA: the whole state of a bucket is one integer, the "theoretical arrival time" (TAT, µs)
// at which the bucket would be full again. bucket.lua.ts implements the same rules in Redis; the memory store calls these.
import type { Decision } from '../types.js';

/** Bucket parameters, in whole microseconds so Lua and JavaScript compute exactly the same numbers. */
export interface GcraParams {
  capacity: number;
  /** Microseconds per token, rounded up: the bucket may refill up to 1 µs per token slower than `rate`, never faster. */
  interval: number;
  /**
   * Microseconds of refill a full bucket holds (capacity × interval), rounded up to a whole µs: a take is charged whole
   * µs, so a fractional burst (capacity 4.1 at 1/s is 4099999.9999999995 µs) would refuse a cost of the whole capacity
   * on a full bucket for ever. Rounding up adds at most 1 µs of refill, once.
   */
  burst: number;
}

export function gcraParams(capacity: number, ratePerSecond: number): GcraParams {
  // 1e6 / rate is off by an ulp or two when rate is itself a rounded quotient (1e6 / (1e6 / 29) is 29.000000000000004):
  // a bare ceil would add a whole µs per token to exact intervals, so shave a relative 1e-12 first.
  const exact = 1_000_000 / ratePerSecond;
  const interval = Math.max(1, Math.ceil(exact - exact * 1e-12));
  // Rounded up as a take of the whole capacity is charged (ceil of the same product), so that such a take fits.
  return { capacity, interval, burst: Math.ceil(capacity * interval) };
}

/**
 * Decides a take of `cost` at `now` (µs) for a bucket whose TAT is `tat` (µs; absent or past means full).
 * `store` is the TAT to write when the decision is a take (`commit`), or undefined when nothing changes; `after` is the
 * TAT once decided (whether written or not). The Redis store calls this with `now` 0 and `tat` relative to the server's
 * clock, as TAKE reports it.
 */
export function decide(
  p: GcraParams,
  tat: number | undefined,
  now: number,
  cost: number,
  commit = true,
): { decision: Decision; store: number | undefined; after: number } {
  const burst = p.burst;
  let base = tat === undefined || tat < now ? now : tat;
  // A TAT beyond now + burst means the clock went back (NTP step, failover to a host whose clock is behind): count the
  // bucket as empty, not as locked for the length of the jump, and let a take write the clamped TAT down.
  const stale = base > now + burst;
  if (stale) base = Math.floor(now + burst);
  // base is a whole µs; adding a whole cost keeps newTat exact, and a tiny cost still costs 1 µs instead of nothing.
  const newTat = base + Math.ceil(cost * p.interval);
  const allowed = newTat - now <= burst;
  const after = allowed ? newTat : base;
  return {
    after,
    store: !commit ? undefined : allowed ? newTat : stale ? base : undefined,
    decision: {
      allowed,
      limit: p.capacity,
      remaining: Math.floor((burst - (after - now)) / p.interval),
      retryAfter: allowed ? 0 : Math.ceil((newTat - burst - now) / 1_000),
      resetAfter: Math.ceil((after - now) / 1_000),
    },
  };
}
