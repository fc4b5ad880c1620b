// packages/koa/README.md "withLock": a per-order lock on Redis, and Redlock over independent masters.
// #region readme
import Koa from 'koa';
import Router from '@koa/router';
import { Redis } from 'ioredis';
import { withLock } from '@hasp/koa';

const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379');
const app = new Koa();
const router = new Router();

router.post('/orders/:id/purchase', withLock((ctx) => `order:${ctx.params.id}`, { redis, ttl: 10_000 }), async (ctx) => {
  const lease = ctx.state.lock!; // held until this middleware returns (or throws), extended meanwhile
  if (await isPaid(ctx.params.id!)) {
    ctx.body = { status: 'already-purchased' }; // a retry after a dropped connection: nothing to do
    return;
  }
  // lease.signal aborts if the lock is lost; lease.fence lets the database refuse a stale writer.
  await charge(ctx.params.id!, { fence: lease.fence, signal: lease.signal });
  ctx.body = { status: 'purchased' };
});

// An array of clients of independent masters makes a Redlock: the lock survives a minority of them failing.
const nodes = (process.env.REDIS_NODES ?? 'redis://127.0.0.1:6380,redis://127.0.0.1:6381,redis://127.0.0.1:6382')
  .split(',')
  .map((url) => new Redis(url));
router.post('/payouts/:id', withLock((ctx) => `payout:${ctx.params.id}`, { redis: nodes, wait: 2_000 }), async (ctx) => {
  ctx.body = { paid: ctx.params.id, fence: ctx.state.lock!.fence };
});
app.use(router.routes());
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
const { url, close } = await serve(app.callback());
const replies = await Promise.all([1, 2, 3].map(() => send('POST', `${url}/orders/7/purchase`)));
assert.deepEqual(replies.map((r) => r.status).sort(), [200, 423, 423]);
assert.ok(Number(replies.find((r) => r.status === 423)!.headers.get('retry-after')) >= 1);
assert.deepEqual((await send('POST', `${url}/orders/7/purchase`)).body, { status: 'already-purchased' });
const payouts = await Promise.all([send('POST', `${url}/payouts/1`), send('POST', `${url}/payouts/1`)]);
assert.deepEqual(payouts.map((r) => r.status), [200, 200]); // wait: 2_000 queues the second behind the first
const fences = payouts.map((r) => (r.body as { fence: number }).fence);
assert.notEqual(fences[0], fences[1]);
await close();
await Promise.all([redis, ...nodes].map((c) => c.quit()));
