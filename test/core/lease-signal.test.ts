// lease.signal is made on first read: whenever it is read, it tells the same story as one made with the lease, also
// when the event loop stalled past the lease's end and the expiry timer has not run yet.
import { describe, expect, it } from 'vitest';
import { LockLostError, MemoryLock, RedisLock, Redlock, type LockErrorEvent } from '../../packages/core/src/index.js';
import { lockNames } from '../../packages/core/src/lock/redis-store.js';
import { abortReason, privateRedis, rejection, uniquePrefix } from './helpers.js';

describe('lease.signal read late', () => {
  it('is aborted with an AbortError when first read after release, and the same object on every read', async () => {
    const locks = new MemoryLock();
    const lease = await locks.acquire('k');
    expect(await lease.release()).toBe(true);
    const signal = lease.signal;
    expect(signal.aborted).toBe(true);
    expect(signal.reason).toBeInstanceOf(Error);
    expect((signal.reason as Error).name).toBe('AbortError');
    expect(lease.signal).toBe(signal);
    locks.close();
  });

  it('is aborted with the LockLostError when first read after the lease expired', async () => {
    const locks = new MemoryLock();
    const lease = await locks.acquire('k', { ttl: 30 });
    // Read nothing until the lease is over: wait for the lock to be free for another acquirer.
    const next = await locks.acquire('k', { wait: 2_000 });
    const reason = await abortReason(lease.signal, 1_000, 'the expired lease signal');
    expect(reason).toBeInstanceOf(LockLostError);
    expect(lease.signal.reason).toBe(reason);
    await next.release();
    locks.close();
  });

  it('fires abort listeners added before the end exactly once', async () => {
    const locks = new MemoryLock();
    const lease = await locks.acquire('k');
    let fired = 0;
    lease.signal.addEventListener('abort', () => fired++);
    await lease.release();
    await lease.release();
    expect(fired).toBe(1);
    expect(lease.signal.reason).toMatchObject({ name: 'AbortError' });
    locks.close();
  });
});

/** Blocks the event loop until `until` (epoch ms), as a long synchronous step or a debugger pause would. */
function stallUntil(until: number): void {
  while (Date.now() <= until) {
    // busy: no timer can run
  }
}

describe('lease.signal and extend after an event-loop stall past the lease end', () => {
  const redis = privateRedis();

  it('reads aborted with the expiry at once, before the expiry timer had a chance to run (MemoryLock, clock moved)', async () => {
    let now = 1_000_000;
    const events: LockErrorEvent[] = [];
    const locks = new MemoryLock({ clock: () => now, onError: (e) => events.push(e) });
    const lease = await locks.acquire('k', { ttl: 1_000 });
    expect(lease.signal.aborted).toBe(false);
    now += 1_001;
    expect(lease.signal.aborted).toBe(true);
    expect(lease.signal.reason).toBeInstanceOf(LockLostError);
    expect((lease.signal.reason as Error).message).toMatch(/expired/);
    expect(events).toMatchObject([{ operation: 'lost', key: 'k' }]);
    locks.close();
  });

  it('reads aborted right after a real stall on a RedisLock lease, with no await in between', async () => {
    const client = redis.node.client();
    const locks = new RedisLock(client, { prefix: uniquePrefix('stall') });
    const lease = await locks.acquire('k', { ttl: 200 });
    const signal = lease.signal;
    stallUntil(lease.expiresAt);
    expect(lease.signal.aborted).toBe(true);
    expect(signal.aborted).toBe(true);
    expect(lease.signal.reason).toBeInstanceOf(LockLostError);
    locks.close();
    client.disconnect();
  });

  it('refuses to extend a lease past its end by the clock even while Redis still holds it', async () => {
    const client = redis.node.client();
    const prefix = uniquePrefix('stall-extend');
    // A large drift allowance ends the lease half a ttl before Redis drops the key: room to look at that gap.
    const locks = new Redlock([client], { prefix, driftFactor: 0.5 });
    const lease = await locks.acquire('k', { ttl: 2_000 });
    stallUntil(lease.expiresAt);
    // Called before anything else runs (the expiry timer would end the lease at the first await).
    const extending = lease.extend();
    expect(await rejection(extending)).toBeInstanceOf(LockLostError);
    expect(lease.signal.reason).toBeInstanceOf(LockLostError);
    // Redis held the lock all along: an extension sent there would have been granted.
    expect(await redis.admin.pttl(lockNames(prefix, 'k').lock)).toBeGreaterThan(0);
    locks.close();
    client.disconnect();
  });
});
