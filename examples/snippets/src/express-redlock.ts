// packages/express/README.md "withLock": Redlock over independent masters, or a locker configured by hand.
// #region readme
import express from 'express';
import { Redis } from 'ioredis';
import { Redlock } from '@hasp/core';
import { withLock } from '@hasp/express';

// Independent Redis masters (not replicas of each other): a lock is held once a majority granted it.
const urls = process.env.REDIS_NODES ?? 'redis://127.0.0.1:6379,redis://127.0.0.1:6380,redis://127.0.0.1:6381';
const nodes = urls.split(',').map((url) => new Redis(url));
const app = express();

// An array of clients makes a Redlock (shared by every withLock given the same clients) ...
app.post('/orders/:id/refund', withLock((req) => `order:${req.params.id}`, { redis: nodes }), refund);

// ... or bring any locker you configured yourself: RedisLock, Redlock or MemoryLock.
const locker = new Redlock(nodes, { ttl: 10_000, retryCount: 3 });
app.post('/reports/daily', withLock(() => 'report:daily', { locker, wait: 5_000 }), buildReport);
// #endregion readme

async function refund(req: express.Request, res: express.Response): Promise<void> {
  await new Promise((resolve) => setTimeout(resolve, 200));
  res.json({ refunded: req.params.id, fence: req.lock!.fence });
}
async function buildReport(_req: express.Request, res: express.Response): Promise<void> {
  await new Promise((resolve) => setTimeout(resolve, 100));
  res.json({ built: true });
}

import { assert, send, serve } from './check.js';
const { url, close } = await serve(app);
const refunds = await Promise.all([send('POST', `${url}/orders/9/refund`), send('POST', `${url}/orders/9/refund`)]);
assert.deepEqual(refunds.map((r) => r.status).sort(), [200, 423]);
// wait: 5_000 queues the second report behind the first instead of answering 423.
const reports = await Promise.all([send('POST', `${url}/reports/daily`), send('POST', `${url}/reports/daily`)]);
assert.deepEqual(reports.map((r) => r.status), [200, 200]);
await close();
await Promise.all(nodes.map((n) => n.quit()));
