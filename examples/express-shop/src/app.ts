// The shop's routes on Express 5: rate-limited SMS codes and logins, a locked purchase per order, and a health check.
import { TokenBucket } from '@hasp/core';
import { rateLimit, withLock } from '@hasp/express';
import express, { type ErrorRequestHandler, type NextFunction, type Request, type Response } from 'express';
import { logStoreState, pay, type ShopOptions, type Stores } from '@hasp/example-shop-common';

// The demo's only account.
const USERS: Record<string, string> = { alice: 'wonderland' };

/** Builds the Express app on the given stores. */
export function createApp(stores: Stores, options: ShopOptions): express.Express {
  const { redis, lockRedis, orders } = stores;
  const app = express();
  app.use(express.json({ limit: '16kb' }));

  // --- SMS codes: 3 per phone number per 10 minutes, and 10 per client IP per 10 minutes. ---
  // Two limiters, two policy names: each has its own buckets, and the response lists both in RateLimit-Policy.
  // onStoreState logs when Redis goes down (each process then counts alone) and when it is back: once each, not per request.
  const smsPerIp = rateLimit({ capacity: 10, rate: '10/10min', redis, policy: 'sms-ip', onStoreState: logStoreState('sms-ip') });
  const smsPhone = { capacity: 3, rate: '3/10min', redis, policy: 'sms-phone', onStoreState: logStoreState('sms-phone') };
  const smsPerPhone = rateLimit({ ...smsPhone, key: (req) => req.body.phone });

  app.post('/sms/send', requireFields('phone'), smsPerIp, smsPerPhone, (req, res) => {
    // A real shop would call its SMS provider here.
    res.json({ sent: true, to: req.body.phone, remaining: req.rateLimit?.remaining });
  });

  // --- Login: 5 attempts per username and IP per 15 minutes, against password guessing. ---
  // A shared TokenBucket (instead of capacity/rate) so that a successful login can refill it.
  const loginAttempts = new TokenBucket({ capacity: 5, rate: '5/15min', redis, prefix: 'shop:login:' });
  const loginKey = (req: Request): string => `${req.body.username}|${req.ip}`;

  app.post('/login', requireFields('username', 'password'), rateLimit({ bucket: loginAttempts, policy: 'login', key: loginKey }), async (req, res) => {
    const { username, password } = req.body as { username: string; password: string };
    if (USERS[username] !== password) {
      res.status(401).json({ error: 'INVALID_CREDENTIALS', attemptsLeft: req.rateLimit?.remaining });
      return;
    }
    // Redis down (the limiter then runs on its in-memory fallback): nothing to refill, the login still succeeds.
    await loginAttempts.reset(loginKey(req)).catch(() => undefined);
    res.json({ ok: true, user: username });
  });

  // --- Purchase: one at a time per order. A double click or a retry gets 423 while the first one pays. ---
  app.post(
    '/orders/:id/purchase',
    validOrderId,
    withLock((req) => `order:${req.params.id}`, { redis: lockRedis }),
    async (req, res) => {
      const id = String(req.params.id);
      const lease = req.lock!; // set by withLock: the lock is held until this response is sent
      // Check and act under the lock: no other request for this order runs between the check and the write.
      const before = await orders.get(id);
      if (before.purchases > 0) {
        // A retry after a dropped connection: answer what happened instead of charging again.
        res.json({ order: id, status: 'already-purchased', purchases: before.purchases });
        return;
      }
      // lease.signal aborts if the lock is lost (e.g. Redis lost the key): stop paying then.
      const payment = await pay(id, options.paymentMs, lease.signal);
      // The fence makes the write safe even if this request stalled past its lease: the book refuses older fences.
      const order = await orders.recordPurchase(id, lease.fence);
      res.json({ order: id, status: 'purchased', purchases: order.purchases, paymentId: payment.paymentId, fence: lease.fence });
    },
  );

  app.get('/orders/:id', validOrderId, async (req, res) => {
    res.json(await orders.get(String(req.params.id)));
  });

  app.get('/health', async (_req, res) => {
    // With Redis, healthy means connected; limits then fall back to memory and locks answer 503 until it is back.
    const ok = redis === undefined || redis.status === 'ready';
    res.status(ok ? 200 : 503).json({ ok, store: stores.mode, redis: redis?.status });
  });

  app.use((_req, res) => {
    res.status(404).json({ error: 'NOT_FOUND' });
  });
  app.use(jsonErrors);
  return app;
}

/** 400 unless the JSON body has these string fields. */
function requireFields(...names: string[]) {
  return (req: Request, res: Response, next: NextFunction): void => {
    const body = (req.body ?? {}) as Record<string, unknown>;
    const missing = names.filter((n) => typeof body[n] !== 'string' || (body[n] as string).length === 0 || (body[n] as string).length > 100);
    if (missing.length > 0) {
      res.status(400).json({ error: 'BAD_REQUEST', message: `send a JSON body with ${missing.join(', ')} (strings)` });
      return;
    }
    next();
  };
}

function validOrderId(req: Request, res: Response, next: NextFunction): void {
  if (!/^[\w-]{1,64}$/.test(String(req.params.id))) {
    res.status(400).json({ error: 'BAD_REQUEST', message: 'order ids are 1-64 letters, digits, _ or -' });
    return;
  }
  next();
}

/**
 * The app's error handler: hasp's errors are `http-errors` with `status`, `code` and `headers` (Retry-After, and the
 * RateLimit fields on a 429); send them as JSON.
 */
const jsonErrors: ErrorRequestHandler = (err, _req, res, next) => {
  const e = err as { status?: number; statusCode?: number; expose?: boolean; code?: string; message?: string; headers?: Record<string, string> };
  if (res.headersSent) {
    next(err);
    return;
  }
  const status = e.status ?? e.statusCode ?? 500;
  if (status >= 500 && e.code !== 'LOCK_UNAVAILABLE' && e.code !== 'RATE_LIMIT_UNAVAILABLE') console.error(err);
  if (e.headers) res.set(e.headers);
  const expose = e.expose ?? status < 500;
  res.status(status).json({ error: e.code ?? (status >= 500 ? 'INTERNAL' : 'ERROR'), message: expose ? e.message : 'Internal Server Error' });
};
