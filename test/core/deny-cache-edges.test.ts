// The Redis bucket store's remembered refusals and bookkeeping, pinned after mutation testing (review 56): a reset made
// elsewhere is seen within the deny cache's second however long the refusal, the map of changed keys stays bounded,
// and a server refusing EVALSHA gets EVAL from then on (no refused EVALSHA per call).
import { TokenBucket } from '@hasp/core';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { RedisBucketStore } from '../../packages/core/src/rate-limit/bucket-store.js';
import { gcraParams } from '../../packages/core/src/rate-limit/gcra.js';
import { startRedis, stopAll, type RedisNode } from '../harness/redis.js';
import { uniquePrefix } from './helpers.js';

let node: RedisNode;
let admin: Redis;
beforeAll(async () => {
  node = await startRedis();
  admin = node.client();
});
afterAll(async () => {
  await stopAll();
});

it('sees a reset made elsewhere within DENY_CACHE_MS even when the remembered denial is an hour long', async () => {
  const prefix = uniquePrefix('r56-elsewhere');
  const a = new TokenBucket({ capacity: 1, rate: '1/h', redis: admin, prefix });
  const b = new TokenBucket({ capacity: 1, rate: '1/h', redis: admin, prefix });
  expect((await a.take('k')).allowed).toBe(true);
  expect((await a.take('k')).allowed).toBe(false);
  await b.reset('k');
  await new Promise((r) => setTimeout(r, 1_100));
  expect((await a.take('k')).allowed).toBe(true);
});

it('keeps the keys changed during the call timeout bounded (deniedMax)', async () => {
  const store = new RedisBucketStore(admin, uniquePrefix('r56-changed'), gcraParams(1, 1 / 3_600), 2_000, 50);
  await Promise.all(Array.from({ length: 200 }, (_, i) => store.reset(`k${i}`)));
  expect((store as unknown as { changed: Map<string, number> }).changed.size).toBeLessThanOrEqual(50);
});

it('after one refused EVALSHA, sends every call as EVAL (no EVALSHA error per call)', async () => {
  const renamed = await startRedis({ args: ['--rename-command', 'EVALSHA', '""'] });
  const c = renamed.client();
  const bucket = new TokenBucket({ capacity: 100, rate: '1/h', redis: c, prefix: uniquePrefix('r56-evalonly') });
  const errors = async () => Number(/errorstat_ERR:count=(\d+)/.exec(await c.info('errorstats'))?.[1] ?? 0);
  for (let i = 0; i < 3; i++) await bucket.take(`warm${i}`);
  const before = await errors();
  for (let i = 0; i < 10; i++) await bucket.take(`k${i}`);
  expect((await errors()) - before).toBe(0);
  c.disconnect();
  await renamed.stop();
});
