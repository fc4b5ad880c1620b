// The timers and clock of hasp's own Redis I/O: when merged calls go out, when a call times out, how long a bucket's
// refusal is kept, when a circuit probes. They are bounded by real round trips, so they run on Node's real timers and
// monotonic clock whatever fake timers a user's test suite installs (Vitest, Jest and Sinon replace the global
// functions, `performance`, and `node:timers`' exports): a merged command waiting on a faked setImmediate never went
// out, and a call timeout on a clock that stands still never fired. What the user's code sees as time (a lease's
// expiry and auto-extension, a wait's deadline, the in-memory twins) keeps following the fakes.
import { performance as nodePerformance } from 'node:perf_hooks';
import * as timers from 'node:timers';

/** Whether `fn` is a fake: @sinonjs/fake-timers copies its clock method's own `hadOwnProperty` onto it; Jest's legacy
 * fakes are mock functions. */
function faked(fn: unknown): boolean {
  return (
    typeof fn !== 'function' ||
    Object.prototype.hasOwnProperty.call(fn, 'hadOwnProperty') ||
    (fn as { _isMockFunction?: unknown })._isMockFunction === true
  );
}

// Read once, now: later reads of the module's exports (a CommonJS build reads them per call) would see the fakes.
const loadedSetImmediate = timers.setImmediate;
const loadedSetTimeout = timers.setTimeout;
const loadedClearTimeout = timers.clearTimeout;
const loadedNextTick = process.nextTick;

/**
 * `setImmediate` as Node had it when hasp loaded. Loaded under fakes already (Jest's `enableGlobally`), the end of the
 * turn is out of reach: a microtask stands in (merged calls then share fewer commands, but go out).
 */
export const realSetImmediate: <A extends unknown[]>(fn: (...args: A) => void, ...args: A) => void = faked(loadedSetImmediate)
  ? (fn, ...args) => {
      void Promise.resolve().then(() => fn(...args));
    }
  : (loadedSetImmediate as unknown as <A extends unknown[]>(fn: (...args: A) => void, ...args: A) => void);

/** `setTimeout` as Node had it when hasp loaded (the fake's, if hasp loaded under fakes: nothing else keeps time). */
export const realSetTimeout: typeof timers.setTimeout = loadedSetTimeout;
/** `clearTimeout` to go with {@link realSetTimeout} (a fake one may refuse a real timer). */
export const realClearTimeout: typeof timers.clearTimeout = loadedClearTimeout;

/**
 * `process.nextTick` as Node had it when hasp loaded (Jest's modern fakes replace it by default: a merged call waiting
 * on it never went out, and every later call on its connection joined it). A microtask stands in for a fake.
 */
export const realNextTick: <A extends unknown[]>(fn: (...args: A) => void, ...args: A) => void = faked(loadedNextTick)
  ? (fn, ...args) => {
      void Promise.resolve().then(() => fn(...args));
    }
  : (loadedNextTick.bind(process) as <A extends unknown[]>(fn: (...args: A) => void, ...args: A) => void);

/**
 * The real `performance.now`, a method of perf_hooks' `performance`: taken from its prototype, since fakes replace the
 * global `performance` object (or its own `now`).
 */
export const PERF_NOW = (Object.getPrototypeOf(nodePerformance) as { now: () => number }).now;

/** The real `performance.now()`. */
export function realPerfNow(): number {
  return PERF_NOW.call(nodePerformance);
}
