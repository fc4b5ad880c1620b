// packages/koa/README.md "Quick start": rateLimit and withLock with @koa/router on the in-memory default.
// #region readme
import Koa from 'koa';
import Router from '@koa/router';
import { bodyParser } from '@koa/bodyparser';
import { rateLimit, withLock } from '@hasp/koa';

const app = new Koa();
const router = new Router();
app.use(bodyParser());

// 3 SMS per phone number per 10 minutes: the 4th request gets 429 with Retry-After.
const phone = (ctx: Koa.Context) => String((ctx.request.body as { phone?: unknown } | undefined)?.phone);
router.post('/sms/send', rateLimit({ capacity: 3, rate: '3/10min', key: phone, policy: 'sms' }), (ctx) => {
  ctx.body = { sent: true, left: ctx.state.rateLimit?.remaining };
});

// One purchase per order at a time: a double submit gets 423 Locked while the first request still runs.
router.post('/orders/:id/purchase', withLock((ctx) => `order:${ctx.params.id}`), async (ctx) => {
  await chargeCustomer(ctx.params.id!, ctx.state.lock!.fence);
  ctx.body = { purchased: ctx.params.id };
});

app.use(router.routes());
// #endregion readme

async function chargeCustomer(_order: string, _fence: number): Promise<void> {
  await new Promise((resolve) => setTimeout(resolve, 300));
}

import { assert, send, serve, statuses } from './check.js';
const { url, close } = await serve(app.callback());
assert.deepEqual(await statuses(4, 'POST', `${url}/sms/send`, { phone: '+15551234567' }), [200, 200, 200, 429]);
const denied = await send('POST', `${url}/sms/send`, { phone: '+15551234567' });
assert.equal(denied.headers.get('ratelimit-policy'), '"sms";q=3;w=600');
assert.match(denied.headers.get('ratelimit') ?? '', /^"sms";r=0;t=\d+$/);
assert.ok(Number(denied.headers.get('retry-after')) >= 1);
const both = await Promise.all([send('POST', `${url}/orders/42/purchase`), send('POST', `${url}/orders/42/purchase`)]);
assert.deepEqual(both.map((r) => r.status).sort(), [200, 423]);
await close();
