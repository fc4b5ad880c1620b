// Options a caller did not give are never read from Object.prototype, which some other library may have polluted.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MemoryLock, RedisLock, TokenBucket } from '../../packages/core/src/index.js';
import { RateLimiter } from '../../packages/core/src/http/rate-limiter.js';
import { startRedis, stopAll, type RedisNode } from '../harness/redis.js';

let node: RedisNode;
beforeAll(async () => {
  node = await startRedis();
});
afterAll(async () => {
  await stopAll();
});

function polluted<T>(name: string, value: unknown, fn: () => Promise<T>): Promise<T> {
  (Object.prototype as Record<string, unknown>)[name] = value;
  return fn().finally(() => delete (Object.prototype as Record<string, unknown>)[name]);
}

describe('Object.prototype pollution', () => {
  it('an inherited owner does not let every acquirer re-enter every lock', async () => {
    const locks = new RedisLock(node.client());
    for (const L of [locks, new MemoryLock()]) {
      const second = await polluted('owner', 'x', async () => {
        const a = await L.acquire('acct');
        const b = await L.tryAcquire('acct');
        await b?.release();
        await a.release();
        return b;
      });
      expect(second).toBeNull();
    }
    locks.close();
  });

  it('an inherited ttl does not shorten every lease', async () => {
    const locks = new RedisLock(node.client());
    const lease = await polluted('ttl', 50, () => locks.acquire('t'));
    expect(lease.expiresAt - Date.now()).toBeGreaterThan(20_000);
    await lease.release();
    locks.close();
  });

  it('an unrelated enumerable property does not make every acquire throw', async () => {
    await expect(polluted('someFlag', true, async () => (await new MemoryLock().acquire('k')).release())).resolves.toBe(true);
  });

  it('an inherited key does not put every client of a rate limiter in one bucket', async () => {
    const redis = node.client();
    const seen = await polluted('key', 'everyone', async () => {
      const limiter = new RateLimiter<string>({ capacity: 1, rate: '1/h', redis }, (ip) => ip);
      return [await limiter.check('10.0.0.1'), await limiter.check('10.0.0.2')].map((d) => d?.allowed);
    });
    expect(seen).toEqual([true, true]);
  });

  it('an inherited redis does not move an in-memory bucket to Redis', async () => {
    const b = await polluted('redis', node.client(), async () => new TokenBucket({ capacity: 1, rate: 1 }));
    expect(b.redis).toBeUndefined();
  });
});
