// hasp under the fake timers of users' own test suites (Vitest's here; Jest and Sinon fake the same globals): the
// in-memory twins' leases end and waits resolve as the fake clock advances, expiries agree with the faked Date.now(),
// and buckets refill with the faked time; calls to Redis go out, answer and time out in real time.
import { afterAll, afterEach, describe, expect, it, vi } from 'vitest';
import { LockLostError, MemoryLock, RedisLock, Redlock, TokenBucket } from '../../packages/core/src/index.js';
import { startRedis, startRedisNodes, stopAll, type RedisNode } from '../harness/redis.js';
import { rejection, uniquePrefix } from './helpers.js';

// Captured before any test fakes them: the time these tests give Redis is real.
const realSetTimeout = globalThis.setTimeout;
const realNow = performance.now.bind(performance);

/** `promise`'s outcome, or a failure naming `what` after `ms` ms of real time. */
function withinReal<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  return Promise.race([
    promise,
    new Promise<never>((_, reject) => realSetTimeout(() => reject(new Error(`${what} did not settle within ${ms} ms`)), ms)),
  ]);
}

const sleepReal = (ms: number) => new Promise((resolve) => realSetTimeout(resolve, ms));

afterEach(() => {
  vi.useRealTimers();
});

afterAll(async () => {
  await stopAll();
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

describe('Redis-backed calls under fake timers', () => {
  let node: RedisNode | undefined;
  const redis = async () => {
    node ??= await startRedis();
    const client = node.client();
    expect(await client.ping()).toBe('PONG');
    return client;
  };

  it('answers a bucket take on Redis, and a refusal kept locally ends with real time, though the fake clock stands still', async () => {
    const client = await redis();
    try {
      const bucket = new TokenBucket({ capacity: 1, rate: '10/s', redis: client, prefix: uniquePrefix('fake') });
      vi.useFakeTimers();
      expect(await withinReal(bucket.take('k'), 5_000, 'the take')).toMatchObject({ allowed: true });
      expect(await withinReal(bucket.take('k'), 5_000, 'the refused take')).toMatchObject({ allowed: false });
      // A token is back on Redis's clock after 100 ms; the refusal this process keeps must not outlast it.
      await sleepReal(250);
      expect(await withinReal(bucket.take('k'), 5_000, 'the take after the refill')).toMatchObject({ allowed: true });
    } finally {
      client.disconnect();
    }
  });

  it('acquires, refuses and releases a RedisLock', async () => {
    const client = await redis();
    const locks = new RedisLock(client, { prefix: uniquePrefix('fake') });
    try {
      vi.useFakeTimers();
      const lease = await withinReal(locks.acquire('k'), 5_000, 'the acquire');
      expect(await withinReal(locks.tryAcquire('k'), 5_000, 'the busy attempt')).toBeNull();
      expect(await withinReal(lease.release(), 5_000, 'the release')).toBe(true);
    } finally {
      locks.close();
      client.disconnect();
    }
  });

  it('sends a release though process.nextTick is faked while it is made (Jest fakes it by default)', async () => {
    const client = await redis();
    const locks = new RedisLock(client, { prefix: uniquePrefix('fake') });
    try {
      const lease = await locks.acquire('k');
      // Vitest cannot fake nextTick in this pool; a fake that never runs what it is given, in place only while the
      // release is made, stands in for Jest's.
      const nextTick = process.nextTick;
      process.nextTick = (() => undefined) as typeof process.nextTick;
      let released: Promise<boolean>;
      try {
        released = lease.release();
      } finally {
        process.nextTick = nextTick;
      }
      expect(await withinReal(released, 1_000, 'the release')).toBe(true);
      // And the connection goes on working.
      expect(await withinReal(locks.tryAcquire('k'), 1_000, 'the next acquire')).not.toBeNull();
    } finally {
      locks.close();
      client.disconnect();
    }
  });

  it('rejects a Redlock acquire without a quorum in real time (its rounds are paced by real timers)', async () => {
    const nodes = await startRedisNodes(3);
    const clients = nodes.map((n) => n.client());
    const locks = new Redlock(clients, { prefix: uniquePrefix('fake'), retryCount: 3 });
    try {
      expect(await Promise.all(clients.map((c) => c.ping()))).toEqual(['PONG', 'PONG', 'PONG']);
      await Promise.all([nodes[1]!.kill(), nodes[2]!.kill()]);
      vi.useFakeTimers();
      const outcome = await withinReal(rejection(locks.acquire('k')), 5_000, 'the acquire');
      expect(outcome).toMatchObject({ code: 'LOCK_UNAVAILABLE' });
    } finally {
      vi.useRealTimers();
      locks.close();
      for (const c of clients) c.disconnect();
    }
  });

  it('times a call out on a frozen server in real time', async () => {
    const client = await redis();
    try {
      const bucket = new TokenBucket({ capacity: 1, rate: '1/s', redis: client, timeout: 300, prefix: uniquePrefix('fake') });
      vi.useFakeTimers();
      node!.pause();
      const started = realNow();
      const outcome = await withinReal(rejection(bucket.take('k')), 5_000, 'the take');
      expect(outcome).toMatchObject({ code: 'RATE_LIMIT_UNAVAILABLE' });
      expect(realNow() - started).toBeGreaterThanOrEqual(290);
    } finally {
      node!.resume();
      client.disconnect();
    }
  });
});
