// The soak's invariant checkers catch what they are meant to catch: overlapping leases, falling fences, bucket
// over-admission between data losses, hung operations and untyped errors.
import { describe, expect, it } from 'vitest';
import { LockBusyError, LockUnavailableError, type Lease } from '../../packages/core/src/index.js';
import { BucketChecker, LockChecker, OpTracker } from './checks.js';

/** A stand-in lease: the checker reads only token, fence and expiresAt. */
function lease(token: string, fence: number, expiresAt: number): Lease {
  return { key: 'k', token, fence, expiresAt } as unknown as Lease;
}

describe('LockChecker', () => {
  it('flags a second holder inside a valid lease and a fence that does not rise, but not an overrun', () => {
    const c = new LockChecker();
    const now = Date.now();
    const a = lease('a', 10, now + 10_000);
    c.enter('k', a);
    c.enter('k', lease('b', 11, now + 10_000));
    expect(c.exclusionViolations).toBe(1);
    const j = lease('c', 5, now + 10_000);
    c.enter('j', j);
    c.exit('j', j);
    c.enter('j', lease('d', 5, now + 10_000));
    expect(c.fenceRegressions).toBe(1);
    // An expired holder still inside is an overrun, and the next holder may enter.
    const old = lease('e', 1, now - 1);
    c.enter('x', old);
    c.enter('x', lease('f', 2, now + 10_000));
    c.exit('x', old);
    expect(c.overruns).toBe(1);
    expect(c.violations).toBe(2);
    expect(c.examples).toHaveLength(2);
  });
});

describe('BucketChecker', () => {
  it('allows capacity + rate × elapsed, flags one more, and restarts the allowance after a data loss', () => {
    const c = new BucketChecker(5, 10);
    // 1 s: allowance 5 + 10 = 15.
    for (let i = 0; i < 15; i++) c.record('s', 'k', i * 60, i * 60 + 1, true);
    c.record('s', 'k', 990, 1_000, true);
    c.record('s', 'k', 990, 1_000, false);
    expect(c.check()).toBe(1);
    // After a loss the bucket starts full again: 15 more right after the restart are within that stretch's allowance.
    const d = new BucketChecker(5, 10);
    for (let i = 0; i < 15; i++) d.record('s', 'k', i * 60, i * 60 + 1, true);
    d.dataLoss('s', 1_000, 1_100);
    // From the loss (1 000) to the last answer (2 321): 5 + 10 × 1.321 → 18.
    for (let i = 0; i < 15; i++) d.record('s', 'k', 1_200 + i * 80, 1_201 + i * 80, true);
    for (let i = 0; i < 3; i++) d.record('s', 'k', 2_300, 2_301, true);
    expect(d.check()).toBe(0);
    d.record('s', 'k', 2_300, 2_301, true);
    expect(d.check()).toBe(1);
    // An admission straddling the loss counts in neither stretch.
    d.record('s', 'k', 900, 1_200, true);
    expect(d.check()).toBe(1);
  });
});

describe('OpTracker', () => {
  it('counts outcomes by code, flags a hang at its bound, and keeps untyped errors', async () => {
    const t = new OpTracker();
    expect(await t.run('op', 1_000, ['LOCK_BUSY'], async () => 1)).toBe(1);
    expect(await t.run('op', 1_000, ['LOCK_BUSY'], () => Promise.reject(new LockBusyError('k')))).toBeUndefined();
    await t.run('op', 1_000, ['LOCK_BUSY'], () => Promise.reject(new LockUnavailableError('down')));
    await t.run('op', 1_000, ['LOCK_BUSY'], () => Promise.reject(new Error('plain')));
    const slow = t.run('op', 20, [], () => new Promise((resolve) => setTimeout(resolve, 200)));
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(t.hangs).toBe(1);
    expect(t.inFlight).toBe(1);
    await slow;
    expect(t.inFlight).toBe(0);
    expect(Object.fromEntries(t.counts)).toEqual({ 'op ok': 2, 'op LOCK_BUSY': 1, 'op untyped': 2 });
    expect(t.untypedCount).toBe(2);
    expect(t.total(/untyped/)).toBe(2);
  });
});
