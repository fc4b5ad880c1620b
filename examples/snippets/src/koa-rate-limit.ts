// packages/koa/README.md "rateLimit": limiters on Redis per IP and per phone, and a login bucket a success refills.
// #region readme
import Koa from 'koa';
import Router from '@koa/router';
import { bodyParser } from '@koa/bodyparser';
import { Redis } from 'ioredis';
import { TokenBucket } from '@hasp/core';
import { rateLimit } from '@hasp/koa';

const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379');
const app = new Koa();
const router = new Router();
app.use(bodyParser());
const body = (ctx: Koa.Context) => ctx.request.body as Record<string, string | undefined>;

router.post(
  '/sms/send',
  // Per client IP (the default key, ctx.ip): 10 per 10 minutes.
  rateLimit({ capacity: 10, rate: '10/10min', redis, policy: 'sms-ip' }),
  // Per phone number: 3 per 10 minutes. Each limiter adds its member to RateLimit-Policy and RateLimit.
  rateLimit({ capacity: 3, rate: '3/10min', redis, policy: 'sms-phone', key: (ctx) => String(body(ctx).phone) }),
  (ctx) => {
    ctx.body = { sent: true };
  },
);

// 5 login attempts per username and IP per 15 minutes; a shared bucket, so a successful login can refill it.
const attempts = new TokenBucket({ capacity: 5, rate: '5/15min', redis, prefix: 'login:' });
const attemptKey = (ctx: Koa.Context) => `${body(ctx).username}|${ctx.ip}`;
const loginLimit = rateLimit({
  bucket: attempts,
  policy: 'login',
  key: attemptKey,
  // Answer a denied request yourself instead of throwing the 429; Retry-After and RateLimit are already set.
  handler: (ctx, decision) => {
    ctx.status = 429;
    ctx.body = { error: 'too many attempts', retryInSeconds: Math.ceil(decision.retryAfter / 1000) };
  },
});
router.post('/login', loginLimit, async (ctx) => {
  if (!(await passwordMatches(body(ctx).username, body(ctx).password))) {
    ctx.status = 401;
    ctx.body = { error: 'wrong username or password' };
    return;
  }
  await attempts.reset(attemptKey(ctx));
  ctx.body = { ok: true };
});
app.use(router.routes());
// #endregion readme

async function passwordMatches(username?: string, password?: string): Promise<boolean> {
  return username === 'alice' && password === 'wonderland';
}

import { assert, send, serve, statuses } from './check.js';
const { url, close } = await serve(app.callback());
assert.deepEqual(await statuses(4, 'POST', `${url}/sms/send`, { phone: '+15550000001' }), [200, 200, 200, 429]);
const sms = await send('POST', `${url}/sms/send`, { phone: '+15550000002' });
assert.equal(sms.headers.get('ratelimit-policy'), '"sms-ip";q=10;w=600, "sms-phone";q=3;w=600');
// 6 left for the IP, not 5: the request the phone limit refused cost the IP limit nothing (its token went back).
assert.match(sms.headers.get('ratelimit') ?? '', /^"sms-ip";r=6;t=\d+, "sms-phone";r=2;t=\d+$/);
assert.equal((await send('POST', `${url}/sms/send`, { phone: 15550000009 })).status, 200); // a number is a phone too
const wrong = { username: 'alice', password: 'guess' };
assert.deepEqual(await statuses(4, 'POST', `${url}/login`, wrong), [401, 401, 401, 401]);
assert.equal((await send('POST', `${url}/login`, { username: 'alice', password: 'wonderland' })).status, 200);
assert.deepEqual(await statuses(6, 'POST', `${url}/login`, wrong), [401, 401, 401, 401, 401, 429]);
const denied = await send('POST', `${url}/login`, wrong);
assert.equal((denied.body as { error: string }).error, 'too many attempts');
await close();
await redis.quit();
