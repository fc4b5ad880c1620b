// packages/core/README.md "Token bucket": take, peek, cost and reset on Redis.
// #region readme
import { Redis } from 'ioredis';
import { TokenBucket } from '@hasp/core';

const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379');
const perPhone = new TokenBucket({ capacity: 3, rate: '3/10min', redis });

const d = await perPhone.take('+15551234567');
if (!d.allowed) {
  console.log(`try again in ${Math.ceil(d.retryAfter / 1000)} s`);
}
const next = await perPhone.peek('+15551234567'); // what take() would decide now, consuming nothing
const two = await perPhone.take('+15551234567', 2); // a cost of 2 tokens at once
await perPhone.reset('+15551234567'); // e.g. after the code was verified: full again
// #endregion readme

import { assert } from './check.js';
assert.deepEqual({ allowed: d.allowed, limit: d.limit, remaining: d.remaining, retryAfter: d.retryAfter }, { allowed: true, limit: 3, remaining: 2, retryAfter: 0 });
assert.deepEqual([next.allowed, next.remaining], [true, 1]); // remaining as if taken
assert.equal(two.remaining, 0);
assert.equal((await perPhone.peek('+15551234567', 3)).allowed, true);
await redis.quit();
