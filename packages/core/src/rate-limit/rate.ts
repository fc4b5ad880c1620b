// Parses rates: a number of tokens per second, or strings like '2/s', '30/min', '100/h', '1000/d', '5/10s', '1/500ms'.
import { describe } from '../util/validate.js';

const UNIT_MS: Record<string, number> = {
  ms: 1,
  s: 1_000,
  sec: 1_000,
  second: 1_000,
  m: 60_000,
  min: 60_000,
  minute: 60_000,
  h: 3_600_000,
  hr: 3_600_000,
  hour: 3_600_000,
  d: 86_400_000,
  day: 86_400_000,
};
// The plurals, spelled out: stripping any final 's' would also accept 'ss', 'hs' or 'mss' (which reads as ms, where
// a user may have meant minutes).
for (const unit of ['sec', 'second', 'min', 'minute', 'hr', 'hour', 'day']) UNIT_MS[`${unit}s`] = UNIT_MS[unit]!;

const RATE = /^\s*(\d+(?:\.\d+)?)\s*\/\s*(\d+(?:\.\d+)?)?\s*([a-z]+)\s*$/i;

/**
 * Tokens per second from a number or a rate string (`'<tokens>/<unit>'` or `'<tokens>/<n><unit>'`; units ms, s, sec,
 * second, m, min, minute, h, hr, hour, d, day, and the plurals secs, seconds, mins, minutes, hrs, hours, days).
 * @throws TypeError when `rate` is neither a number nor a string; RangeError when it is not a finite positive rate
 */
export function parseRate(rate: unknown, name = 'rate'): number {
  if (typeof rate === 'number') {
    if (!Number.isFinite(rate) || rate <= 0) throw new RangeError(`${name} must be a finite number > 0, got ${describe(rate)}`);
    return rate;
  }
  if (typeof rate !== 'string') throw new TypeError(`${name} must be a number or a string like '30/min', got ${describe(rate)}`);
  const m = RATE.exec(rate);
  const unit = m?.[3]?.toLowerCase();
  const unitMs = unit !== undefined && Object.hasOwn(UNIT_MS, unit) ? UNIT_MS[unit] : undefined;
  if (!m || unitMs === undefined) {
    throw new RangeError(`${name} must be tokens per second or a string like '2/s', '30/min', '100/h', '1000/d', got ${describe(rate)}`);
  }
  const tokens = Number(m[1]);
  const per = (m[2] === undefined ? 1 : Number(m[2])) * unitMs;
  const perSecond = (tokens * 1_000) / per;
  if (!Number.isFinite(perSecond) || perSecond <= 0) throw new RangeError(`${name} must be a positive rate, got ${describe(rate)}`);
  return perSecond;
}
