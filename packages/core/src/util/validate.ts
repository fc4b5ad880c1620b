// Option validation shared by every constructor: fail at start-up, naming the option.
import { realPerfNow } from './real-timers.js';

/** Drops keys whose value is `undefined`, so spreading over defaults keeps the defaults. */
export function definedOnly<T extends object>(options: T | undefined): Partial<T> {
  // Without a prototype: an option the caller did not give must read as undefined even when some other library has
  // polluted Object.prototype (`Object.prototype.owner = 'x'` would otherwise make every acquire re-enter every lock).
  const out = Object.create(null) as Partial<T>;
  if (options === undefined || options === null) return out;
  if (typeof options !== 'object') throw new TypeError(`options must be an object, got ${describe(options)}`);
  for (const [k, v] of Object.entries(options)) {
    if (v !== undefined) (out as Record<string, unknown>)[k] = v;
  }
  return out;
}

// A URL (also percent-encoded), user@host, or the name of a secret wherever it stands ('?password=', ',password=',
// 'PASSWORD=', a JSON key): alternatives of plain text, so the test is linear in the length. Common shapes, not every
// one: a string passed for the wrong option is cut at 40 characters besides.
const MAY_HOLD_CREDENTIALS = /:\/\/|@|%40|%3a%2f%2f|pass|pwd|\bpw\b|secret|token|auth|credential|apikey|api_key|sig=/i;

/**
 * A short description of a bad option's value for an error message. A string is quoted (shortened), unless it may be a
 * connection string or hold credentials: then only its length is given, as its password would otherwise end up in
 * crash logs. (One linear test, no masking patterns: this also runs on values a request made, such as a cost.)
 */
export function describe(value: unknown): string {
  if (value === null) return 'null';
  if (typeof value === 'string') {
    if (MAY_HOLD_CREDENTIALS.test(value)) return `a string of ${value.length} characters (not shown: it may hold credentials)`;
    return `"${value.length > 40 ? `${value.slice(0, 37)}...` : value}"`;
  }
  if (typeof value === 'number' || typeof value === 'boolean' || typeof value === 'bigint') return String(value);
  if (typeof value === 'function') return 'a function';
  if (Array.isArray(value)) return 'an array';
  return typeof value;
}

/** `defaults` overridden by the caller's defined options, in an object without a prototype (see definedOnly). */
export function withDefaults<D extends object, T extends object>(defaults: D, options: T | undefined): D & Partial<T> {
  return Object.assign(Object.create(null) as object, defaults, definedOnly(options)) as D & Partial<T>;
}

/** A finite number > 0 (or >= 0 with `allowZero`). */
export function positiveNumber(name: string, value: unknown, allowZero = false): number {
  if (typeof value !== 'number') throw new TypeError(`${name} must be a number, got ${describe(value)}`);
  if (!Number.isFinite(value) || (allowZero ? value < 0 : value <= 0)) {
    throw new RangeError(`${name} must be a finite number ${allowZero ? '>= 0' : '> 0'}, got ${describe(value)}`);
  }
  return value;
}

/** A whole number of milliseconds, > 0 (or >= 0 with `allowZero`), at most `max`. */
export function duration(name: string, value: unknown, allowZero = false, max = 2 ** 31 - 1): number {
  positiveNumber(name, value, allowZero);
  const n = value as number;
  if (!Number.isInteger(n)) throw new RangeError(`${name} must be a whole number of milliseconds, got ${n}`);
  if (n > max) throw new RangeError(`${name} must be at most ${max} ms, got ${n}`);
  return n;
}

export function boolean(name: string, value: unknown): boolean {
  if (typeof value !== 'boolean') throw new TypeError(`${name} must be a boolean, got ${describe(value)}`);
  return value;
}

export function string(name: string, value: unknown, allowEmpty = true): string {
  if (typeof value !== 'string') throw new TypeError(`${name} must be a string, got ${describe(value)}`);
  if (!allowEmpty && value.length === 0) throw new RangeError(`${name} must not be empty`);
  return value;
}

export function func<F>(name: string, value: unknown): F {
  if (typeof value !== 'function') throw new TypeError(`${name} must be a function, got ${describe(value)}`);
  return value as F;
}

/** A clock option as the in-memory stores read it (see {@link clock}). */
export interface InjectedClock {
  /**
   * The time: the clock's reading, or when it gives none (not a finite number, or a throw), the last good one counted
   * on by the real clock; never below such a stand-in until the clock passes it.
   */
  now: () => number;
  /** Why a call must not start now: the clock's reading is not a finite number, or it threw; `undefined` when it is good. */
  check: () => Error | undefined;
}

/**
 * A clock option (epoch ms): read once here, so that `() => new Date()` fails at construction. A call that starts on a
 * bad reading is refused ({@link InjectedClock.check}); any other reading (a lease's expiry timer, an auto-extension,
 * a give-back, the grant itself) cannot refuse anything, since a throw there has no caller to go to, and a NaN stored
 * as a lock's end would keep the key for ever: such a reading counts on from the last good one by the real clock, and
 * a clock that comes back below where that got waits there (time never goes back across a bad spell).
 */
export function clock(name: string, value: unknown): InjectedClock {
  const read = func<() => unknown>(name, value);
  const first = reading(name, read);
  if (first instanceof Error) throw first;
  let lastGood = first;
  let lastGoodAt = realPerfNow();
  // How far the time given in place of bad readings got: until the clock passes it again, time stands there rather
  // than go back (a lease counted from a stand-in time would otherwise end after the store's end for it: two holders).
  let floor = -Infinity;
  const good = (t: number): void => {
    lastGood = t;
    lastGoodAt = realPerfNow();
  };
  return {
    now: () => {
      const t = reading(name, read);
      if (t instanceof Error) {
        floor = Math.max(floor, lastGood + (realPerfNow() - lastGoodAt));
        return floor;
      }
      good(t);
      if (t < floor) return floor;
      floor = -Infinity;
      return t;
    },
    check: () => {
      const t = reading(name, read);
      if (t instanceof Error) return t;
      good(t);
      return undefined;
    },
  };
}

function reading(name: string, read: () => unknown): number | TypeError {
  let t: unknown;
  try {
    t = read();
  } catch (error) {
    // Nothing of the thrown value may throw in turn: this runs in timers too.
    let why = 'an error that cannot be shown';
    try {
      why = error instanceof Error ? String(error.message) : describe(error);
    } catch {
      // keep the placeholder
    }
    return new TypeError(`${name} threw: ${why}`, { cause: error });
  }
  if (typeof t === 'number' && Number.isFinite(t)) return t;
  return new TypeError(`${name} must return a finite number of ms, got ${describe(t)}`);
}

/** Lock and bucket keys: any non-empty string. */
export function key(value: unknown): string {
  return string('key', value, false);
}

/** Rejects option names the caller misspelled, so `{ ttl: 5000, wiat: 100 }` fails loudly. */
export function knownKeys(where: string, options: object, allowed: readonly string[]): void {
  for (const k of Object.keys(options)) {
    if (!allowed.includes(k)) throw unknownOption(where, k, allowed);
  }
}

/** The TypeError for an option name `where` does not know. */
export function unknownOption(where: string, name: string, allowed: readonly string[]): TypeError {
  return new TypeError(`${where}: unknown option "${name}" (expected one of: ${allowed.join(', ')})`);
}

export function signal(name: string, value: unknown): AbortSignal {
  if (!(value instanceof AbortSignal)) throw new TypeError(`${name} must be an AbortSignal, got ${describe(value)}`);
  return value;
}

/** A whole number >= `min`. */
export function integer(name: string, value: unknown, min: number): number {
  if (typeof value !== 'number') throw new TypeError(`${name} must be a number, got ${describe(value)}`);
  if (!Number.isInteger(value) || value < min) throw new RangeError(`${name} must be a whole number >= ${min}, got ${describe(value)}`);
  return value;
}
