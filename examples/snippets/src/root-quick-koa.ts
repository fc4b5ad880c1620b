// README.md "Quick start", Koa: a login limit per username and IP, and a per-order purchase lock, in memory.
// #region readme
import Koa from 'koa';
import Router from '@koa/router';
import { bodyParser } from '@koa/bodyparser';
import { rateLimit, withLock } from '@hasp/koa';

const app = new Koa();
const router = new Router();
app.use(bodyParser());
const username = (ctx: Koa.Context) => (ctx.request.body as { username?: string }).username;

router.post('/login', rateLimit({ capacity: 5, rate: '5/15min', key: (ctx) => `${username(ctx)}|${ctx.ip}` }), login);
router.post('/orders/:id/purchase', withLock((ctx) => `order:${ctx.params.id}`), purchase);
app.use(router.routes());
// #endregion readme

function login(ctx: Koa.Context): void {
  ctx.status = 401;
  ctx.body = { error: 'wrong password' };
}
async function purchase(ctx: Koa.Context): Promise<void> {
  await new Promise((resolve) => setTimeout(resolve, 300));
  ctx.body = { purchased: true };
}

import { assert, send, serve, statuses } from './check.js';
const { url, close } = await serve(app.callback());
assert.deepEqual(await statuses(6, 'POST', `${url}/login`, { username: 'alice' }), [401, 401, 401, 401, 401, 429]);
assert.equal((await send('POST', `${url}/login`, { username: 'bob' })).status, 401);
const both = await Promise.all([send('POST', `${url}/orders/1/purchase`), send('POST', `${url}/orders/1/purchase`)]);
assert.deepEqual(both.map((r) => r.status).sort(), [200, 423]);
await close();
