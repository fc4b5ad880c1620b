// packages/core/README.md intro: the three lockers behind one interface, and a token bucket.
// #region readme
import { Redis } from 'ioredis';
import { MemoryLock, RedisLock, Redlock, TokenBucket } from '@hasp/core';

const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379');
const masters = (process.env.REDIS_NODES ?? 'redis://127.0.0.1:6380,redis://127.0.0.1:6381,redis://127.0.0.1:6382')
  .split(',')
  .map((url) => new Redis(url));

const lockers = [
  new MemoryLock(), // this process only, no Redis
  new RedisLock(redis), // every process using this Redis
  new Redlock(masters), // a majority of independent masters
];
for (const locks of lockers) {
  // The same Locker interface everywhere: run a function holding the lock, released afterwards.
  await locks.using('job:nightly', async (lease) => {
    console.log(`${locks.constructor.name} holds ${lease.key} with fence ${lease.fence}`);
  });
}

// 10 requests of burst per client, refilled at 1 per second, counted in Redis with Redis's clock.
const perClient = new TokenBucket({ capacity: 10, rate: '1/s', redis });
const decision = await perClient.take('203.0.113.9');
console.log(decision.allowed, decision.remaining); // true 9

for (const locks of lockers) locks.close(); // hasp's own connections (wake-ups); your clients stay open
await Promise.all([redis, ...masters].map((client) => client.quit()));
// #endregion readme

import { assert } from './check.js';
assert.deepEqual([decision.allowed, decision.remaining], [true, 9]);
