// The in-memory twins under the fake timers of users' own test suites (Vitest's here; Jest and Sinon fake the same
// globals): leases end and waits resolve as the fake clock advances, expiries agree with the faked Date.now(), and
// buckets refill with the faked time.
import { afterEach, describe, expect, it, vi } from 'vitest';
import { LockLostError, MemoryLock, TokenBucket } from '../../packages/core/src/index.js';
import { rejection } from './helpers.js';

afterEach(() => {
  vi.useRealTimers();
});

describe('MemoryLock under fake timers', () => {
  it('dates a lease by the faked Date.now(), also when the fakes start their clock from 0', async () => {
    for (const now of [undefined, 0, Date.UTC(2030, 0, 1)]) {
      vi.useFakeTimers(now === undefined ? undefined : { now });
      const locks = new MemoryLock();
      const lease = await locks.acquire('k', { ttl: 1_000 });
      // Not behind by the process's uptime: the faked performance.now() starts from 0 where the real one was not.
      expect(lease.expiresAt - Date.now()).toBe(1_000);
      await lease.release();
      vi.useRealTimers();
    }
    // And back on the real clocks.
    const lease = await new MemoryLock().acquire('k', { ttl: 1_000 });
    expect(lease.expiresAt - Date.now()).toBeGreaterThan(990);
    expect(lease.expiresAt - Date.now()).toBeLessThanOrEqual(1_000);
    await lease.release();
  });

  it('ends a lease and lets a waiter in as the fake clock advances, and times a wait out by it', async () => {
    vi.useFakeTimers();
    const locks = new MemoryLock();
    const held = await locks.acquire('k', { ttl: 1_000 });
    const waiting = locks.acquire('k', { wait: 5_000 });
    const tooShort = rejection(locks.acquire('k', { wait: 500 }));
    await vi.advanceTimersByTimeAsync(600);
    expect(await tooShort).toMatchObject({ code: 'LOCK_BUSY' });
    await vi.advanceTimersByTimeAsync(500);
    expect(held.signal.aborted).toBe(true);
    expect(held.signal.reason).toBeInstanceOf(LockLostError);
    const next = await waiting;
    expect(next.fence).toBeGreaterThan(held.fence);
    await next.release();
  });

  it('follows fakes that leave performance real when given clock: () => Date.now() (the READMEs say so)', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout', 'Date'] });
    const locks = new MemoryLock({ clock: () => Date.now() });
    await locks.acquire('k', { ttl: 1_000 });
    const waiting = locks.acquire('k', { wait: 5_000 });
    await vi.advanceTimersByTimeAsync(1_100);
    await (await waiting).release();
  });
});

describe('TokenBucket in memory under fake timers', () => {
  it('refills as the fake clock advances, and with the system time set', async () => {
    vi.useFakeTimers();
    const bucket = new TokenBucket({ capacity: 2, rate: '1/s' });
    expect((await bucket.take('k', 2)).allowed).toBe(true);
    expect((await bucket.take('k')).allowed).toBe(false);
    vi.advanceTimersByTime(1_000);
    expect(await bucket.take('k')).toMatchObject({ allowed: true, remaining: 0 });
    vi.setSystemTime(Date.now() + 2_000);
    expect(await bucket.take('k')).toMatchObject({ allowed: true, remaining: 1 });
  });
});
