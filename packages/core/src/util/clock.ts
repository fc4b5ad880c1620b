// The clock lock timing runs on: epoch ms that never jump. A lease's expiry, the Redlock validity (ttl − elapsed −
// drift) and MemoryLock's own bookkeeping must not move when the system clock is stepped (NTP, a VM resumed, an
// operator's `date`): a step forward would free every in-memory lock under its holder, a step back would let a holder
// believe in a lease that Redis has already expired. What other processes compare (a Redlock waiter's place, a fence
// floor) stays on the wall clock.
import { PERF_NOW, realPerfNow } from './real-timers.js';

// Read once: from here on the monotonic clock counts. (Date.now() is whole ms, so this is at most 1 ms behind.) Read
// again only when `performance.now` is replaced, or runs back: fake timers in a user's tests (Vitest, Jest, Sinon) put
// their own in, starting from 0, and restore the real one after; against the old origin every expiry would lie in the
// past by the process's uptime.
let source = performance.now;
let origin = Date.now() - performance.now();
let last = 0;

/**
 * Epoch ms on the monotonic clock, whole like `Date.now()`: equal to it, or behind by less than a ms, until the system
 * clock is stepped (or slewed: by ppm, over hours).
 */
export function monotonicNow(): number {
  const now = performance.now();
  if (now < last || performance.now !== source) {
    source = performance.now;
    origin = Date.now() - now;
  }
  last = now;
  return Math.floor(origin + now);
}

/**
 * A wall clock in epoch ms over `dateNow` (whole ms) with the fraction of a ms that `perfNow` (monotonic) adds: within
 * 1 ms of `dateNow()`, and following it wherever it goes (a stepped clock). Like `dateNow` it never goes back unless
 * that does: re-anchored within the same ms (the two clocks drift apart), it stays at the last reading rather than lose
 * a fraction (a bucket drained to the brim reads a clock that went back as a clock step).
 */
export function subMsClock(dateNow: () => number, perfNow: () => number): () => number {
  let offset = dateNow() - perfNow();
  let last = 0;
  return () => {
    const wall = dateNow();
    let now = perfNow() + offset;
    if (now < wall || now >= wall + 1) {
      offset = wall - perfNow();
      now = wall;
    }
    if (now < last && last < wall + 1) now = last;
    last = now;
    return now;
  };
}

// The real clocks, whatever is installed when this module loads (fake timers may be, in a test setup file): the
// monotonic one from the Performance prototype (fakes replace the global object or its own property), Date.now once it
// is seen as native code (fakes are JavaScript).
let realDateNow: (() => number) | undefined;
let realWall: (() => number) | undefined;
if (isNative(Date.now)) seeRealDateNow(Date.now);

function seeRealDateNow(now: () => number): void {
  realDateNow = now;
  realWall = subMsClock(
    () => now.call(Date),
    realPerfNow,
  );
}

function isNative(fn: unknown): boolean {
  return typeof fn === 'function' && Function.prototype.toString.call(fn).includes('[native code]');
}

/**
 * `Date.now()` with the fraction of a ms the monotonic clock adds (see subMsClock): the in-memory token bucket counts
 * time in µs, and on whole ms every take within one ms would see no refill, so a rate above `capacity` per ms could
 * never be reached. Under fake timers (`Date` or `performance` replaced) it is `Date.now()` alone: their time is whole
 * ms and stands still between steps, which a real fraction added to it would not.
 */
export function wallNow(): number {
  if (Date.now !== realDateNow) {
    // Faked, or real but not seen yet (this module loaded under fake timers).
    if (realDateNow !== undefined || !isNative(Date.now)) return Date.now();
    seeRealDateNow(Date.now);
  }
  if (performance.now !== PERF_NOW) return Date.now();
  return realWall!();
}
