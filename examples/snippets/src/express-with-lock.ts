// packages/express/README.md "withLock": a per-order lock on Redis, with the lease's fence and signal.
// #region readme
import express from 'express';
import { Redis } from 'ioredis';
import { withLock } from '@hasp/express';

const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379');
const app = express();

app.post(
  '/orders/:id/purchase',
  withLock((req) => `order:${req.params.id}`, { redis, ttl: 10_000 }),
  async (req, res) => {
    const order = String(req.params.id);
    const lease = req.lock!; // held until this response is sent, extended while the handler runs
    if (await isPaid(order)) {
      res.json({ status: 'already-purchased' }); // a retry after a dropped connection: nothing to do
      return;
    }
    // lease.signal aborts if the lock is lost; lease.fence lets the database refuse a stale writer.
    await charge(order, { fence: lease.fence, signal: lease.signal });
    res.json({ status: 'purchased' });
  },
);
// #endregion readme

const paid = new Map<string, number>();
async function isPaid(order: string): Promise<boolean> {
  return paid.has(order);
}
async function charge(order: string, { fence, signal }: { fence: number; signal: AbortSignal }): Promise<void> {
  await new Promise((resolve) => setTimeout(resolve, 300));
  signal.throwIfAborted();
  paid.set(order, fence);
}

import { assert, send, serve } from './check.js';
const { url, close } = await serve(app);
const replies = await Promise.all([1, 2, 3].map(() => send('POST', `${url}/orders/7/purchase`)));
assert.deepEqual(replies.map((r) => r.status).sort(), [200, 423, 423]);
const busy = replies.find((r) => r.status === 423)!;
assert.equal((busy.body as { code?: string }).code ?? 'LOCK_BUSY', 'LOCK_BUSY');
assert.ok(Number(busy.headers.get('retry-after')) >= 1);
assert.deepEqual((await send('POST', `${url}/orders/7/purchase`)).body, { status: 'already-purchased' });
await close();
await redis.quit();
