// The clock lock timing runs on: epoch ms that never jump. A lease's expiry, the Redlock validity (ttl − elapsed −
// drift) and MemoryLock's own bookkeeping must not move when the system clock is stepped (NTP, a VM resumed, an
// operator's `date`): a step forward would free every in-memory lock under its holder, a step back would let a holder
// believe in a lease that Redis has already expired. What other processes compare (a Redlock waiter's place, a fence
// floor) stays on the wall clock.

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

// Offset of the wall clock from the monotonic one, and the last reading, for wallNow.
let wallOffset = Date.now() - performance.now();
let lastWall = 0;

/**
 * `Date.now()` with the fraction of a ms that the monotonic clock adds: within 1 ms of it, and following it wherever
 * it goes (a stepped clock, fake timers that replace only `Date`). The in-memory token bucket counts time in µs: on whole
 * ms, every take within one ms would see no refill, and a rate above `capacity` per ms could never be reached. Like
 * `Date.now()` it never goes back unless the system clock does: re-anchored within the same ms, it stays at the last
 * reading rather than lose a fraction (a bucket drained to the brim reads a clock that went back as a clock step).
 */
export function wallNow(): number {
  const wall = Date.now();
  let now = performance.now() + wallOffset;
  if (now < wall || now >= wall + 1) {
    wallOffset = wall - performance.now();
    now = wall;
  }
  if (now < lastWall && lastWall < wall + 1) now = lastWall;
  lastWall = now;
  return now;
}
