// The RateLimit / RateLimit-Policy serializer (draft-ietf-httpapi-ratelimit-headers-10/-11) checked against real
// token-bucket decisions on a controlled clock: q, w, r and t mean what the draft says, and Retry-After >= t.
import { parseRate, TokenBucket } from '@hasp/core';
import { appendListMember, RateLimitFields, retryAfterSeconds, sfInteger, sfString } from '@hasp/core/http';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';

/** A memory bucket on a clock the test moves. */
function bucketAt(capacity: number, rate: number): { bucket: TokenBucket; clock: { now: number } } {
  const clock = { now: 1_000_000 };
  return { bucket: new TokenBucket({ capacity, rate, clock: () => clock.now }), clock };
}

/** Whole tokens the bucket holds at the clock's time (a peek consumes nothing). */
async function tokens(bucket: TokenBucket, key: string): Promise<number> {
  const d = await bucket.peek(key);
  return d.allowed ? d.remaining + 1 : d.remaining;
}

describe('RateLimitFields', () => {
  it('serializes the example of the contract: capacity 10, 2/s, 3 left, policy sms', async () => {
    const { bucket } = bucketAt(10, 2);
    const fields = new RateLimitFields('sms', 10, 2);
    const d = await bucket.take('phone', 7);
    expect(fields.policy).toBe('"sms";q=10;w=5');
    expect(fields.rateLimit(d)).toBe('"sms";r=3;t=1');
  });

  it('rounds w up, never below 1, and escapes the policy name as an sf-string', () => {
    expect(new RateLimitFields('a', 10, 3).policy).toBe('"a";q=10;w=4');
    expect(new RateLimitFields('a', 1, 100).policy).toBe('"a";q=1;w=1');
    expect(new RateLimitFields('a', 100, 100 / 3600).policy).toBe('"a";q=100;w=3600');
    // A window a hair above a whole number of seconds is the next one; ...
    expect(new RateLimitFields('a', 60.0000004, 1).policy).toBe('"a";q=60;w=61');
    expect(new RateLimitFields('a', 1, 1 / 60.0000004).window).toBe(61);
    expect(new RateLimitFields('a', 1e300, 1e-300).window).toBe(sfInteger(Infinity));
    // ... but not a quotient that floating point alone puts there.
    expect(new RateLimitFields('a', 11, parseRate('11/min')).policy).toBe('"a";q=11;w=60');
    expect(new RateLimitFields('a', 21, parseRate('21/15s')).policy).toBe('"a";q=21;w=15');
    for (const unit of ['s', 'min', 'h', 'd'] as const) {
      const seconds = { s: 1, min: 60, h: 3_600, d: 86_400 }[unit];
      for (let n = 1; n <= 200; n++) {
        expect(new RateLimitFields('a', n, parseRate(`${n}/${unit}`)).window).toBe(seconds);
        expect(new RateLimitFields('a', 2 * n, parseRate(`${n}/${unit}`)).window).toBe(2 * seconds);
      }
    }
    expect(new RateLimitFields('say "hi" \\o/', 2, 1).policy).toBe('"say \\"hi\\" \\\\o/";q=2;w=2');
  });

  it('says t=0 for a full bucket', () => {
    const fields = new RateLimitFields('p', 5, 1);
    expect(fields.rateLimit({ allowed: true, limit: 5, remaining: 5, retryAfter: 0, resetAfter: 0 })).toBe('"p";r=5;t=0');
  });

  it('gives t as the whole seconds until one more whole token, and Retry-After >= t, on any bucket and history', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 1, max: 50 }),
        fc.double({ min: 0.01, max: 50, noNaN: true }),
        fc.array(fc.tuple(fc.integer({ min: 0, max: 5_000 }), fc.double({ min: 0.1, max: 1, noNaN: true })), {
          minLength: 1,
          maxLength: 8,
        }),
        async (capacity, rate, steps) => {
          const { bucket, clock } = bucketAt(capacity, rate);
          const fields = new RateLimitFields('p', capacity, rate);
          for (const [wait, share] of steps) {
            clock.now += wait;
            const cost = Math.max(1, Math.round(capacity * share));
            const d = await bucket.take('k', cost);
            const m = /^"p";r=(\d+);t=(\d+)$/.exec(fields.rateLimit(d));
            expect(m).not.toBeNull();
            const r = Number(m![1]);
            const t = Number(m![2]);
            const now = clock.now;
            expect(r).toBe(await tokens(bucket, 'k'));
            if (r >= capacity) {
              expect(t).toBe(0);
            } else {
              expect(t).toBeGreaterThanOrEqual(1);
              // After t seconds the next whole token is there; a second earlier it was not (unless t is 1). The
              // decision carries whole milliseconds (rounded up, so t never comes too early): t may be a second late
              // when the token is due less than 1 ms after a whole second.
              // (The clock only moves forward: a memory bucket forgets keys that are full again.)
              if (t >= 2) {
                clock.now = now + (t - 1) * 1_000 - 1;
                expect(await tokens(bucket, 'k')).toBe(r);
              }
              clock.now = now + t * 1_000;
              expect(await tokens(bucket, 'k')).toBeGreaterThanOrEqual(r + 1);
            }
            if (!d.allowed) {
              const retryAfter = fields.retryAfter(d);
              expect(retryAfter).toBeGreaterThanOrEqual(Math.max(t, 1));
              // Coming back after Retry-After succeeds.
              clock.now = Math.max(clock.now, now + retryAfter * 1_000);
              expect((await bucket.peek('k', cost)).allowed).toBe(true);
            }
          }
        },
      ),
      { numRuns: 300 },
    );
  });
});

describe('Structured Fields helpers', () => {
  it('refuses policy names an sf-string cannot hold, naming the option', () => {
    for (const bad of ['', 'ümlaut', 'new\nline', 'tab\t', 'emoji😀', '\u007f']) {
      expect(() => sfString(bad)).toThrow(RangeError);
      expect(() => sfString(bad)).toThrow(/policy/);
    }
    expect(() => sfString(5)).toThrow(TypeError);
    expect(sfString(' !~')).toBe('" !~"');
  });

  it('clamps integers to what the format allows', () => {
    expect(sfInteger(-1)).toBe(0);
    expect(sfInteger(NaN)).toBe(0);
    expect(sfInteger(2.9)).toBe(2);
    expect(sfInteger(1e20)).toBe(999_999_999_999_999);
  });

  it('appends list members written by another limiter', () => {
    expect(appendListMember(undefined, 'b')).toBe('b');
    expect(appendListMember('', 'b')).toBe('b');
    expect(appendListMember('a', 'b')).toBe('a, b');
    expect(appendListMember(['a', 'x'], 'b')).toBe('a, x, b');
  });

  it('rounds Retry-After up and never answers 0', () => {
    expect(retryAfterSeconds(0)).toBe(1);
    expect(retryAfterSeconds(1)).toBe(1);
    expect(retryAfterSeconds(1_000)).toBe(1);
    expect(retryAfterSeconds(1_001)).toBe(2);
    expect(retryAfterSeconds(1_500, 3)).toBe(3);
  });
});
