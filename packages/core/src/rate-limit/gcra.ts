// Token-bucket arithmetic as GCRA: the whole state of a bucket is one integer, the "theoretical arrival time" (TAT, µs)
// at which the bucket would be full again. bucket.lua.ts implements the same rules in Redis; the memory store calls these.
import type { Decision } from '../types.js';

/** Bucket parameters, in whole microseconds so Lua and JavaScript compute exactly the same numbers. */
export interface GcraParams {
  capacity: number;
  /** Microseconds per token, rounded up: the bucket may refill a hair slower than `rate`, never faster. */
  interval: number;
}

export function gcraParams(capacity: number, ratePerSecond: number): GcraParams {
  return { capacity, interval: Math.max(1, Math.ceil(1_000_000 / ratePerSecond)) };
}

/**
 * Decides a take of `cost` at `now` (µs) for a bucket whose TAT is `tat` (µs; absent or past means full).
 * `newTat` is what to store when the take is allowed.
 */
export function decide(p: GcraParams, tat: number | undefined, now: number, cost: number): { decision: Decision; newTat: number } {
  const base = tat === undefined || tat < now ? now : tat;
  const burst = p.capacity * p.interval;
  const newTat = Math.ceil(base + cost * p.interval);
  const allowed = newTat - now <= burst;
  const after = allowed ? newTat : base;
  return {
    newTat,
    decision: {
      allowed,
      limit: p.capacity,
      remaining: Math.floor((burst - (after - now)) / p.interval),
      retryAfter: allowed ? 0 : Math.ceil((newTat - burst - now) / 1_000),
      resetAfter: Math.ceil((after - now) / 1_000),
    },
  };
}
