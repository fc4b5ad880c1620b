// The rate limiter's store guard, pinned after mutation testing (review 56): probes every 500 ms as documented, a key
// fault's 503 under 'closed' says Retry-After of at least 1, and the 'memory' fallback keeps the limiter's own rate.
import { TokenBucket } from '@hasp/core';
import { RateLimiter, type StoreStateEvent } from '@hasp/core/http';
import { afterAll, expect, it } from 'vitest';
import { startRedis, stopAll } from '../harness/redis.js';
import { bucketKey } from '../core/helpers.js';
import { ready } from '../redlock/support.js';

afterAll(async () => {
  await stopAll();
});

it('probes a store that failed every 500 ms, as documented: back within 800 ms of the failure once writes work', async () => {
  const own = await startRedis();
  const client = own.client();
  const admin = own.client();
  await Promise.all([ready(client), ready(admin)]);
  const heard: { state: string; at: number }[] = [];
  const limiter = new RateLimiter(
    {
      capacity: 5,
      rate: '1/h',
      redis: client,
      policy: 'probe-interval',
      key: (a: { key: string }) => a.key,
      onStoreError: 'open',
      onStoreState: (e: StoreStateEvent) => void heard.push({ state: e.state, at: performance.now() }),
    },
    () => undefined,
  );
  expect((await limiter.check({ key: 'warm' }))?.allowed).toBe(true);
  await admin.config('SET', 'maxmemory-policy', 'noeviction');
  await admin.config('SET', 'maxmemory', '1');
  // A take on a fresh key is refused (OOM): the circuit opens.
  expect(await limiter.check({ key: 'fresh-1' })).toBeUndefined();
  expect(heard.map((e) => e.state)).toEqual(['down']);
  await admin.config('SET', 'maxmemory', '0');
  // Requests keep coming (every 20 ms): the first probe due (500 ms after the failure) finds Redis answering.
  const started = performance.now();
  let i = 0;
  while (heard.length < 2 && performance.now() - started < 3_000) {
    await limiter.check({ key: `poke-${i++}` });
    await new Promise((r) => setTimeout(r, 20));
  }
  expect(heard.map((e) => e.state)).toEqual(['down', 'up']);
  // Slack for a loaded machine: probes every second instead would answer after 1,000 ms at the earliest.
  expect(heard[1]!.at - heard[0]!.at).toBeLessThan(950);
  client.disconnect();
  admin.disconnect();
  await own.stop();
});

it("answers a key fault under 'closed' with a 503 whose Retry-After is at least 1", async () => {
  const own = await startRedis();
  const redis = own.client();
  await ready(redis);
  const prefix = 'hasp:tb:r56-key-fault:';
  const bucket = new TokenBucket({ capacity: 2, rate: '2/h', redis, prefix });
  const limiter = new RateLimiter({ bucket, key: (a: { key: string }) => a.key, onStoreError: 'closed' }, () => undefined);
  await redis.hset(bucketKey(bucket, prefix, 'bad'), 'f', '1');
  const error = (await limiter.check({ key: 'bad' }).then(
    () => undefined,
    (e: unknown) => e,
  )) as { status?: number; headers?: Record<string, string> };
  expect(error.status).toBe(503);
  expect(Number(error.headers?.['Retry-After'])).toBeGreaterThanOrEqual(1);
  redis.disconnect();
  await own.stop();
});

it("under 'memory', the fallback bucket has the limiter's own rate", async () => {
  const { notReady } = await import('../redlock/support.js');
  const own = await startRedis();
  const client = own.client();
  await ready(client);
  const limiter = new RateLimiter({ capacity: 1, rate: '1/h', redis: client, policy: 'fallback-rate', key: 'k', onStoreError: 'memory' }, () => 'k');
  await own.kill();
  await notReady(client);
  expect((await limiter.check({}))?.allowed).toBe(true);
  const denied = await limiter.check({});
  expect(denied?.allowed).toBe(false);
  // One token per hour: the next one is about an hour away (half that with twice the rate).
  expect(denied!.retryAfter).toBeGreaterThan(3_500_000);
  client.disconnect();
});
