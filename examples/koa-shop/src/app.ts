// The shop's routes on Koa 3 with @koa/router: rate-limited SMS codes and logins, a locked purchase per order, health.
import { TokenBucket } from '@hasp/core';
import { rateLimit, withLock } from '@hasp/koa';
import Router from '@koa/router';
import Koa, { type Context, type Next } from 'koa';
import { logStoreState, pay, type ShopOptions, type Stores } from '@hasp/example-shop-common';

declare module 'koa' {
  interface Request {
    /** The parsed JSON body (see jsonBody below); typed as @koa/bodyparser types it. */
    body?: unknown;
  }
}

// The demo's only account.
const USERS: Record<string, string> = { alice: 'wonderland' };

/** Builds the Koa app on the given stores. */
export function createApp(stores: Stores, options: ShopOptions): Koa {
  const { redis, lockRedis, orders } = stores;
  const app = new Koa();
  const router = new Router();
  app.use(jsonErrors);
  app.use(jsonBody);

  // --- SMS codes: 3 per phone number per 10 minutes, and 10 per client IP per 10 minutes. ---
  // Two limiters, two policy names: each has its own buckets, and the response lists both in RateLimit-Policy.
  // onStoreState logs when Redis goes down (each process then counts alone) and when it is back: once each, not per request.
  const smsPerIp = rateLimit({ capacity: 10, rate: '10/10min', redis, policy: 'sms-ip', onStoreState: logStoreState('sms-ip') });
  const smsPhone = { capacity: 3, rate: '3/10min', redis, policy: 'sms-phone', onStoreState: logStoreState('sms-phone') };
  const smsPerPhone = rateLimit({ ...smsPhone, key: (ctx) => field(ctx, 'phone') });

  router.post('/sms/send', requireFields('phone'), smsPerIp, smsPerPhone, (ctx) => {
    // A real shop would call its SMS provider here.
    ctx.body = { sent: true, to: field(ctx, 'phone'), remaining: ctx.state.rateLimit?.remaining };
  });

  // --- Login: 5 attempts per username and IP per 15 minutes, against password guessing. ---
  // A shared TokenBucket (instead of capacity/rate) so that a successful login can refill it.
  const loginAttempts = new TokenBucket({ capacity: 5, rate: '5/15min', redis, prefix: 'shop:login:' });
  const loginKey = (ctx: Context): string => `${field(ctx, 'username')}|${ctx.ip}`;

  router.post('/login', requireFields('username', 'password'), rateLimit({ bucket: loginAttempts, policy: 'login', key: loginKey }), async (ctx) => {
    const username = field(ctx, 'username')!;
    if (USERS[username] !== field(ctx, 'password')) {
      ctx.status = 401;
      ctx.body = { error: 'INVALID_CREDENTIALS', attemptsLeft: ctx.state.rateLimit?.remaining };
      return;
    }
    // Redis down (the limiter then runs on its in-memory fallback): nothing to refill, the login still succeeds.
    await loginAttempts.reset(loginKey(ctx)).catch(() => undefined);
    ctx.body = { ok: true, user: username };
  });

  // --- Purchase: one at a time per order. A double click or a retry gets 423 while the first one pays. ---
  router.post('/orders/:id/purchase', validOrderId, withLock((ctx) => `order:${ctx.params.id}`, { redis: lockRedis }), async (ctx) => {
    const id = String(ctx.params.id);
    const lease = ctx.state.lock!; // set by withLock: the lock is held until this middleware returns
    // Check and act under the lock: no other request for this order runs between the check and the write.
    const before = await orders.get(id);
    if (before.purchases > 0) {
      // A retry after a dropped connection: answer what happened instead of charging again.
      ctx.body = { order: id, status: 'already-purchased', purchases: before.purchases };
      return;
    }
    // lease.signal aborts if the lock is lost (e.g. Redis lost the key): stop paying then.
    const payment = await pay(id, options.paymentMs, lease.signal);
    // The fence makes the write safe even if this request stalled past its lease: the book refuses older fences.
    const order = await orders.recordPurchase(id, lease.fence);
    ctx.body = { order: id, status: 'purchased', purchases: order.purchases, paymentId: payment.paymentId, fence: lease.fence };
  });

  router.get('/orders/:id', validOrderId, async (ctx) => {
    ctx.body = await orders.get(String(ctx.params.id));
  });

  router.get('/health', (ctx) => {
    // With Redis, healthy means connected; limits then fall back to memory and locks answer 503 until it is back.
    const ok = redis === undefined || redis.status === 'ready';
    ctx.status = ok ? 200 : 503;
    ctx.body = { ok, store: stores.mode, redis: redis?.status };
  });

  app.use(router.routes());
  app.use(router.allowedMethods());
  app.use((ctx) => {
    ctx.status = 404;
    ctx.body = { error: 'NOT_FOUND' };
  });
  return app;
}

/** A string field of the JSON body, if present. */
function field(ctx: Context, name: string): string | undefined {
  const body = ctx.request.body;
  const value = typeof body === 'object' && body !== null ? (body as Record<string, unknown>)[name] : undefined;
  return typeof value === 'string' ? value : undefined;
}

/** 400 unless the JSON body has these string fields. */
function requireFields(...names: string[]) {
  return (ctx: Context, next: Next) => {
    const missing = names.filter((n) => {
      const v = field(ctx, n);
      return v === undefined || v.length === 0 || v.length > 100;
    });
    if (missing.length > 0) {
      ctx.status = 400;
      ctx.body = { error: 'BAD_REQUEST', message: `send a JSON body with ${missing.join(', ')} (strings)` };
      return;
    }
    return next();
  };
}

function validOrderId(ctx: Context, next: Next) {
  if (!/^[\w-]{1,64}$/.test(String(ctx.params.id))) {
    ctx.status = 400;
    ctx.body = { error: 'BAD_REQUEST', message: 'order ids are 1-64 letters, digits, _ or -' };
    return;
  }
  return next();
}

const BODY_LIMIT = 16 * 1024;

/** A small JSON body parser (16 kB), so the example needs no body-parser package; @koa/bodyparser works the same. */
async function jsonBody(ctx: Context, next: Next): Promise<void> {
  if (ctx.method === 'POST' && ctx.is('application/json')) {
    const chunks: Buffer[] = [];
    let size = 0;
    for await (const chunk of ctx.req as AsyncIterable<Buffer>) {
      size += chunk.length;
      if (size > BODY_LIMIT) ctx.throw(413, 'request body too large', { code: 'BODY_TOO_LARGE' });
      chunks.push(chunk);
    }
    const text = Buffer.concat(chunks).toString('utf8');
    let parsed: unknown;
    try {
      parsed = text.length === 0 ? {} : JSON.parse(text);
    } catch {
      ctx.throw(400, 'the body is not valid JSON', { code: 'BAD_REQUEST' });
    }
    ctx.request.body = parsed;
  }
  await next();
}

/**
 * The app's error handler: hasp's errors are `http-errors` with `status`, `code` and `headers` (Retry-After, and the
 * RateLimit fields on a 429); send them as JSON. (Koa's own handler would send them as text.)
 */
async function jsonErrors(ctx: Context, next: Next): Promise<void> {
  try {
    await next();
  } catch (err) {
    const e = err as { status?: number; expose?: boolean; code?: string; message?: string; headers?: Record<string, string> };
    const status = e.status ?? 500;
    if (status >= 500 && e.code !== 'LOCK_UNAVAILABLE' && e.code !== 'RATE_LIMIT_UNAVAILABLE') console.error(err);
    if (e.headers) ctx.set(e.headers);
    const expose = e.expose ?? status < 500;
    ctx.status = status;
    ctx.body = { error: e.code ?? (status >= 500 ? 'INTERNAL' : 'ERROR'), message: expose ? e.message : 'Internal Server Error' };
  }
}
