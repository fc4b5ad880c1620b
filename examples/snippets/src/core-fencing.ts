// packages/core/README.md "Fencing tokens": pass lease.fence with every write and let the resource refuse stale ones.
import { Redis } from 'ioredis';
import { RedisLock } from '@hasp/core';

const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379');
const locks = new RedisLock(redis);
// A stand-in for a database whose accounts table keeps the highest fence it accepted.
const accounts = new Map<string, { balance: number; fence: number }>();
const db = {
  async query(_sql: string, [balance, fence, id]: [number, number, string]): Promise<{ rowCount: number }> {
    const row = accounts.get(id) ?? { balance: 0, fence: 0 };
    if (!(row.fence <= fence)) return { rowCount: 0 };
    accounts.set(id, { balance, fence });
    return { rowCount: 1 };
  },
};
const sql = 'UPDATE accounts SET balance = $1, fence = $2 WHERE id = $3 AND fence <= $2';
const id = 'acct-1';
const balance = 100;
// #region readme
await locks.using(`account:${id}`, async (lease) => {
  // UPDATE accounts SET balance = $1, fence = $2 WHERE id = $3 AND fence <= $2
  await db.query(sql, [balance, lease.fence, id]);
});
// #endregion readme

import { assert } from './check.js';
const first = accounts.get(id)!;
assert.equal(first.balance, 100);
// A later lease has a larger fence; a write carrying the old fence is refused.
await locks.using(`account:${id}`, async (lease) => {
  assert.ok(lease.fence > first.fence);
  assert.equal((await db.query(sql, [200, lease.fence, id])).rowCount, 1);
  // A second write of the same lease carries the same fence, and goes through.
  assert.equal((await db.query(sql, [250, lease.fence, id])).rowCount, 1);
});
assert.equal((await db.query(sql, [300, first.fence, id])).rowCount, 0);
await redis.quit();
