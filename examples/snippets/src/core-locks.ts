// packages/core/README.md "Locks": using(), acquire()/release() and tryAcquire() on a RedisLock.
// #region readme
import { Redis } from 'ioredis';
import { RedisLock } from '@hasp/core';

const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379');
const locks = new RedisLock(redis, { ttl: 10_000 });

// using(): acquire, run, release in finally; extended automatically while fn runs.
const total = await locks.using('invoice:7', async (lease) => {
  // lease.signal aborts if the lock is lost (e.g. Redis lost the key): pass it to cancellable work.
  return chargeCustomer({ fence: lease.fence, signal: lease.signal });
}, { wait: 2_000 });

// acquire()/release(): explicit control.
const lease = await locks.acquire('report:daily', { wait: 5_000 });
try {
  await buildReport();
} finally {
  await lease.release();
}

// tryAcquire(): null when busy, no exception.
const maybe = await locks.tryAcquire('cron:cleanup');
if (maybe) {
  try { await cleanup(); } finally { await maybe.release(); }
}
// #endregion readme

async function chargeCustomer({ fence, signal }: { fence: number; signal: AbortSignal }): Promise<number> {
  signal.throwIfAborted();
  return fence > 0 ? 42 : 0;
}
async function buildReport(): Promise<void> {}
async function cleanup(): Promise<void> {}

import { assert } from './check.js';
assert.equal(total, 42);
assert.ok(maybe); // nobody else held it
assert.equal(await lease.release(), false); // already released: idempotent
await redis.quit();
