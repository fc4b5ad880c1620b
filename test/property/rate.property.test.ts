// Property tests of the rate parser: any input either parses to a finite positive rate or throws TypeError/RangeError
// naming `rate`, and every well-formed rate string means the tokens per second it spells.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { TokenBucket } from '../../packages/core/src/index.js';
import { parseRate } from '../../packages/core/src/rate-limit/rate.js';

/** Seconds per unit, written out independently of the parser's table. */
const UNITS: [string[], number][] = [
  [['ms'], 0.001],
  [['s', 'sec', 'secs', 'second', 'seconds'], 1],
  [['m', 'min', 'mins', 'minute', 'minutes'], 60],
  [['h', 'hr', 'hrs', 'hour', 'hours'], 3_600],
  [['d', 'day', 'days'], 86_400],
];

/** Either a rate, or a TypeError/RangeError that names the option. */
function outcome(input: unknown): { rate: number } | { error: unknown } {
  try {
    return { rate: parseRate(input) };
  } catch (error) {
    return { error };
  }
}

function expectParsedOrRejected(input: unknown): void {
  const result = outcome(input);
  if ('rate' in result) {
    expect(Number.isFinite(result.rate) && result.rate > 0, `${String(input)} -> ${result.rate}`).toBe(true);
  } else {
    expect(result.error instanceof TypeError || result.error instanceof RangeError, String(result.error)).toBe(true);
    expect((result.error as Error).message).toMatch(/\brate\b/);
  }
}

/** A decimal number as users write it: digits, optionally a fraction. */
const decimal = fc
  .tuple(fc.integer({ min: 0, max: 100_000 }), fc.option(fc.stringMatching(/^\d{1,4}$/), { nil: undefined }))
  .map(([whole, fraction]) => (fraction === undefined ? String(whole) : `${whole}.${fraction}`));

const space = fc.constantFrom('', ' ', '  ', '\t');

const wellFormed = fc
  .record({
    tokens: decimal,
    per: fc.option(decimal, { nil: undefined }),
    unit: fc.constantFrom(...UNITS.flatMap(([names, seconds]) => names.map((name) => ({ name, seconds })))),
    upper: fc.array(fc.boolean(), { minLength: 8, maxLength: 8 }),
    spaces: fc.array(space, { minLength: 5, maxLength: 5 }),
  })
  .map(({ tokens, per, unit, upper, spaces }) => {
    const name = [...unit.name].map((c, i) => (upper[i] ? c.toUpperCase() : c)).join('');
    const [a, b, c, d, e] = spaces as [string, string, string, string, string];
    const text = `${a}${tokens}${b}/${c}${per ?? ''}${d}${name}${e}`;
    const expected = Number(tokens) / ((per === undefined ? 1 : Number(per)) * unit.seconds);
    return { text, expected };
  });

describe('parseRate', () => {
  it('parses or rejects any string with a TypeError or RangeError naming rate, never anything else', () => {
    fc.assert(
      fc.property(fc.string({ maxLength: 30 }), (s) => expectParsedOrRejected(s)),
      { numRuns: 2_000 },
    );
    // Strings close to valid ones: pieces of the grammar in any order.
    const piece = fc.constantFrom('1', '0', '2.5', '.', '/', ' ', 's', 'ms', 'min', 'h', 'd', 'e3', '-', '+', 'x', '9'.repeat(400), '\0');
    fc.assert(
      fc.property(fc.array(piece, { maxLength: 8 }), (parts) => expectParsedOrRejected(parts.join(''))),
      { numRuns: 2_000 },
    );
  });

  it.each(['5/ss', '1/mss', '1/hs', '1/ds', '1/ms s', '1/dayss', '1/constructor', '1/__proto__', '1/hasownproperty'])(
    'rejects %j: an s after a unit that is not its plural, or a name on every object, is no unit',
    (text) => {
      expect(() => parseRate(text)).toThrow(RangeError);
      expect(() => parseRate(text)).toThrow(/\brate\b/);
    },
  );

  it('rejects any value that is not a number or a string with a TypeError, and bad numbers with a RangeError', () => {
    fc.assert(
      fc.property(fc.anything(), (value) => {
        expectParsedOrRejected(value);
        const result = outcome(value);
        if (typeof value !== 'number' && typeof value !== 'string') expect((result as { error: unknown }).error).toBeInstanceOf(TypeError);
        if (typeof value === 'number') {
          if (Number.isFinite(value) && value > 0) expect(result).toEqual({ rate: value });
          else expect((result as { error: unknown }).error).toBeInstanceOf(RangeError);
        }
      }),
      { numRuns: 1_000 },
    );
  });

  it('reads every well-formed string as the tokens per second it spells', () => {
    fc.assert(
      fc.property(wellFormed, ({ text, expected }) => {
        const result = outcome(text);
        if (Number.isFinite(expected) && expected > 0) {
          expect('rate' in result, `${JSON.stringify(text)} parses`).toBe(true);
          const rate = (result as { rate: number }).rate;
          expect(Math.abs(rate - expected) / expected, JSON.stringify(text)).toBeLessThan(1e-12);
        } else {
          // Zero tokens or a zero period: not a rate.
          expect((result as { error: unknown }).error, JSON.stringify(text)).toBeInstanceOf(RangeError);
        }
      }),
      { numRuns: 2_000 },
    );
  });

  it('gives TokenBucket the same rate, or the same kind of error, for any input', () => {
    fc.assert(
      fc.property(fc.oneof(wellFormed.map((w) => w.text), fc.string({ maxLength: 12 }), fc.double()), (rate) => {
        const parsed = outcome(rate);
        let bucket: TokenBucket | undefined;
        let error: unknown;
        try {
          bucket = new TokenBucket({ capacity: 1, rate });
        } catch (e) {
          error = e;
        }
        if ('error' in parsed) {
          expect(error?.constructor).toBe((parsed.error as Error).constructor);
        } else if (bucket) {
          expect(bucket.rate).toBe(parsed.rate);
        } else {
          // Parsed, but outside what a bucket can keep (faster than 1 token per µs, or slower than ~71 years per token).
          expect(error).toBeInstanceOf(RangeError);
          expect(parsed.rate > 1e6 || 1 / parsed.rate > 2 ** 51 / 1e6).toBe(true);
        }
      }),
      { numRuns: 2_000 },
    );
  });
});
