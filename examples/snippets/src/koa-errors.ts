// packages/koa/README.md "Errors": a first middleware that sends hasp's http-errors as JSON, headers included.
import Koa from 'koa';
import Router from '@koa/router';
import { rateLimit, withLock } from '@hasp/koa';

const app = new Koa();
// #region readme
// First in the chain. hasp throws http-errors: status, expose, code, and the headers to send.
app.use(async (ctx, next) => {
  try {
    await next();
  } catch (err) {
    const e = err as { status?: number; expose?: boolean; code?: string; message: string; headers?: Record<string, string> };
    if (e.headers) ctx.set(e.headers); // Retry-After; on a 429 also RateLimit-Policy and RateLimit
    ctx.status = e.status ?? 500;
    ctx.body = { code: e.code, message: e.expose ? e.message : 'Internal Server Error' };
  }
});
// #endregion readme
const router = new Router();
router.get('/limited', rateLimit({ capacity: 1, rate: '1/h' }), (ctx) => {
  ctx.body = { ok: true };
});
router.post('/locked', withLock(() => 'the-one-key'), async (ctx) => {
  await new Promise((resolve) => setTimeout(resolve, 300));
  ctx.body = { ok: true };
});
app.use(router.routes());

import { assert, send, serve } from './check.js';
const { url, close } = await serve(app.callback());
assert.equal((await send('GET', `${url}/limited`)).status, 200);
const limited = await send('GET', `${url}/limited`);
assert.equal(limited.status, 429);
assert.deepEqual(limited.body, { code: 'RATE_LIMITED', message: 'Too many requests: rate limit exceeded' });
assert.equal(limited.headers.get('retry-after'), '3600');
assert.equal(limited.headers.get('ratelimit'), '"default";r=0;t=3600');
const [a, b] = await Promise.all([send('POST', `${url}/locked`), send('POST', `${url}/locked`)]);
const busy = a!.status === 423 ? a! : b!;
assert.equal(busy.status, 423);
assert.equal((busy.body as { code: string }).code, 'LOCK_BUSY');
await close();
