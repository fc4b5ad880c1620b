// The RateLimit / RateLimit-Policy fields (draft-ietf-httpapi-ratelimit-headers-10/-11, RFC 9651 Structured Fields)
// and Retry-After: the one place that knows the draft's syntax and how a token bucket maps onto it.
//
// Mapping of a token bucket (capacity C, rate R tokens/s) onto the draft's fields:
//   RateLimit-Policy: "<policy>";q=<C>;w=<ceil(C / R)>      (w: the time an empty bucket takes to refill)
//   RateLimit:        "<policy>";r=<remaining>;t=<seconds until the next whole token, rounded up; 0 when full>
//   Retry-After:      <seconds until the request's cost is available, rounded up, >= t, >= 1>   (denials only)
// e.g. capacity 10, rate 2/s, 3 tokens left, policy "sms": `RateLimit-Policy: "sms";q=10;w=5`, `RateLimit: "sms";r=3;t=1`.
// The draft has no burst parameter, so q/w advertise the conservative "C per C/R seconds"; r/t are exact (r: whole
// tokens left after this request; t: a client waiting t seconds finds at least r + 1). Both fields are Structured Field
// Lists: a route behind two limiters gets one member per policy, in middleware order. They are sent on every response
// of a limited route (allowed, denied, and errors thrown further down the chain), not for requests whose key is
// undefined or that passed unlimited under onStoreError 'open'. The policy name is an sf-string: printable ASCII only.
import { gcraParams } from '../rate-limit/gcra.js';
import type { Decision } from '../types.js';
import { describe } from '../util/validate.js';

/** Name of the field that lists the policies. */
export const POLICY_FIELD = 'RateLimit-Policy';
/** Name of the field that carries the current state of each policy. */
export const RATELIMIT_FIELD = 'RateLimit';
/** Name of the field that tells a refused client when to come back. */
export const RETRY_AFTER_FIELD = 'Retry-After';

// RFC 9651 §3.3.1: Integers have at most 15 digits.
const SF_INTEGER_MAX = 999_999_999_999_999;

/**
 * Serializes `value` as a Structured Fields String (RFC 9651 §4.1.6): `"` and `\` are escaped; anything outside
 * printable ASCII (0x20-0x7E) cannot be represented and throws.
 * @param name - the option name to put in the error message
 * @throws TypeError when `value` is not a string; RangeError when it is empty or holds a character an sf-string cannot hold
 */
export function sfString(value: unknown, name = 'policy'): string {
  if (typeof value !== 'string') throw new TypeError(`${name} must be a string, got ${describe(value)}`);
  if (value.length === 0) throw new RangeError(`${name} must not be empty`);
  for (let i = 0; i < value.length; i++) {
    const c = value.charCodeAt(i);
    if (c < 0x20 || c > 0x7e) {
      throw new RangeError(
        `${name} must be printable ASCII (a Structured Fields string), got character U+${c.toString(16).toUpperCase().padStart(4, '0')} at index ${i}`,
      );
    }
  }
  return `"${value.replace(/[\\"]/g, '\\$&')}"`;
}

/** A non-negative Structured Fields Integer: floored, clamped to the 15 digits the format allows. */
export function sfInteger(n: number): number {
  if (!(n > 0)) return 0;
  return n >= SF_INTEGER_MAX ? SF_INTEGER_MAX : Math.floor(n);
}

/** Appends `item` to a List-valued field that may already hold members (another limiter on the same route). */
export function appendListMember(existing: unknown, item: string): string {
  if (existing === undefined || existing === '') return item;
  if (Array.isArray(existing)) return existing.length === 0 ? item : `${existing.join(', ')}, ${item}`;
  return `${String(existing)}, ${item}`;
}

/**
 * Whole seconds for a Retry-After: `ms` rounded up, never below `atLeast`, never 0 (a refused client that
 * comes back at once is refused again).
 */
export function retryAfterSeconds(ms: number, atLeast = 1): number {
  const s = Math.ceil(ms / 1_000);
  return s > atLeast ? s : atLeast > 1 ? atLeast : 1;
}

/** The RateLimit fields of one policy, serialized once at construction; the per-request part is one concatenation. */
export class RateLimitFields {
  /** The serialized `RateLimit-Policy` member, e.g. `"sms";q=10;w=5`. */
  readonly policy: string;
  /** `q`: the quota, the bucket's capacity. */
  readonly quota: number;
  /** `w`: seconds an empty bucket takes to fill, rounded up. */
  readonly window: number;
  private readonly itemPrefix: string;
  // Milliseconds per token, as the bucket computes it (whole microseconds, rounded up).
  private readonly tokenMs: number;

  /**
   * @param name - the policy name (printable ASCII)
   * @param capacity - the bucket's capacity
   * @param rate - the bucket's refill rate, tokens per second
   * @throws RangeError or TypeError naming `policy` when the name is not a valid sf-string
   */
  constructor(name: string, capacity: number, rate: number) {
    const sfName = sfString(name, 'policy');
    this.quota = sfInteger(capacity);
    // A relative 1e-12 shaved off before rounding up, as gcraParams does: a rate such as '11/min' is 11/60 tokens per
    // second in floating point, which makes 11 ÷ rate 60.000000000000007, and a bare ceil a window a second too long.
    const w = capacity / rate;
    this.window = Math.max(1, sfInteger(Number.isFinite(w) ? Math.ceil(w - w * 1e-12) : w));
    this.policy = `${sfName};q=${this.quota};w=${this.window}`;
    this.itemPrefix = `${sfName};r=`;
    this.tokenMs = gcraParams(capacity, rate).interval / 1_000;
  }

  /** `t`: whole seconds until the bucket holds one more whole token, rounded up; 0 when it is full. */
  nextToken(d: Decision): number {
    if (d.resetAfter <= 0) return 0;
    // The bucket holds exactly limit − resetAfter/tokenMs tokens; the next whole one (remaining + 1) is this far away.
    const missing = d.limit - d.remaining - 1;
    // (With a fractional capacity the bucket may fill up before another whole token fits: then it is resetAfter.)
    const ms = missing > 0 ? d.resetAfter - missing * this.tokenMs : d.resetAfter;
    // Not full means at least a moment away, even when rounding says otherwise.
    return ms > 1_000 ? sfInteger(Math.ceil(ms / 1_000)) : 1;
  }

  /** The serialized `RateLimit` member for a decision, e.g. `"sms";r=3;t=1`. */
  rateLimit(d: Decision): string {
    return `${this.itemPrefix}${sfInteger(d.remaining)};t=${this.nextToken(d)}`;
  }

  /** Retry-After for a denied decision: time until `cost` tokens are there, rounded up, ≥ `t`, never 0. */
  retryAfter(d: Decision): number {
    return retryAfterSeconds(d.retryAfter, this.nextToken(d));
  }
}
