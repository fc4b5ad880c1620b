// lease.signal is made on first read: whenever it is read, it tells the same story as one made with the lease.
import { describe, expect, it } from 'vitest';
import { LockLostError, MemoryLock } from '../../packages/core/src/index.js';
import { abortReason } from './helpers.js';

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
