// The HTTP server side, run in its own forked child: an Express or Koa app with one limiter (or lock) in front of a
// handler that answers "ok". Every variant keys on the `x-key` request header, uses one ioredis client on the same
// Redis, and keeps its library's default response headers.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import * as haspExpress from '@hasp/express';
import * as haspKoa from '@hasp/koa';
import express, { type ErrorRequestHandler, type RequestHandler } from 'express';
import { rateLimit as erlRateLimit } from 'express-rate-limit';
import { Redis } from 'ioredis';
import Koa, { type Middleware } from 'koa';
import koaRatelimit from 'koa-ratelimit';
import { RedisStore, type RedisReply } from 'rate-limit-redis';
import { RateLimiterRedis } from 'rate-limiter-flexible';
import { LIMITS, type Regime } from './limits.js';

export { LIMITS, type Regime };
export type Framework = 'express' | 'koa';
/**
 * `redis-get` is no limiter but a floor: one plain GET of the request's key per request, on an auto-pipelining client,
 * so what any limiter that asks Redis once per request costs at least, before doing anything.
 */
export type HttpVariant = 'bare' | 'hasp' | 'erl' | 'rlf' | 'koa-ratelimit' | 'hasp-lock' | 'redis-get';

export interface HttpServerJob {
  framework: Framework;
  variant: HttpVariant;
  regime: Regime;
  redisPort: number;
}


const header = (h: http.IncomingHttpHeaders): string | undefined => h['x-key'] as string | undefined;

export async function startServer(job: HttpServerJob): Promise<{ port: number; close(): Promise<void> }> {
  const redis = new Redis({ port: job.redisPort, host: '127.0.0.1', enableAutoPipelining: job.variant === 'redis-get' });
  await redis.ping();
  const { capacity, perMinute } = LIMITS[job.regime];
  const handler = job.framework === 'express' ? expressApp(job, redis, capacity, perMinute) : koaApp(job, redis, capacity, perMinute);
  const server = http.createServer(handler);
  server.keepAliveTimeout = 60_000;
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as AddressInfo).port,
    close: async () => {
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
      redis.disconnect();
    },
  };
}

/** rate-limiter-flexible on Redis, as its README sets it up against floods: keys over their points blocked in memory. */
function rlfLimiter(redis: Redis, perMinute: number): RateLimiterRedis {
  return new RateLimiterRedis({ storeClient: redis, points: perMinute, duration: 60, inMemoryBlockOnConsumed: perMinute });
}

function expressApp(job: HttpServerJob, redis: Redis, capacity: number, perMinute: number): http.RequestListener {
  const app = express();
  let mw: RequestHandler | undefined;
  switch (job.variant) {
    case 'bare':
      break;
    case 'hasp':
      mw = haspExpress.rateLimit({ capacity, rate: `${perMinute}/min`, redis, key: (req) => header(req.headers) });
      break;
    case 'redis-get':
      mw = (req, _res, next) => {
        redis.get(header(req.headers) ?? '').then(() => next(), next);
      };
      break;
    case 'hasp-lock': {
      // Distinct keys: a fresh key per request, so no request ever waits for another.
      let n = 0;
      mw = haspExpress.withLock(() => `req:${++n}`, { redis });
      break;
    }
    case 'erl':
      mw = erlRateLimit({
        windowMs: 60_000,
        limit: perMinute,
        keyGenerator: (req) => header(req.headers) ?? '',
        store: new RedisStore({ sendCommand: (command: string, ...args: string[]) => redis.call(command, ...args) as Promise<RedisReply> }),
      });
      break;
    case 'rlf': {
      // The Express middleware from rate-limiter-flexible's README, with the in-memory block its README recommends
      // ("avoid extra requests to store"): a key over its points is refused from memory until its window ends.
      const limiter = rlfLimiter(redis, perMinute);
      mw = (req, res, next) => {
        limiter
          .consume(header(req.headers) ?? '')
          .then(() => next())
          .catch(() => res.status(429).send('Too Many Requests'));
      };
      break;
    }
    default:
      throw new Error(`no Express variant ${job.variant}`);
  }
  if (mw) app.use(mw);
  app.get('/', (_req, res) => {
    res.send('ok');
  });
  // hasp forwards http-errors (429, 423, 503) to the app's error handling, as the SPEC says; answer them plainly.
  const onError: ErrorRequestHandler = (err: { status?: number; headers?: Record<string, string>; message?: string }, _req, res, _next) => {
    res.status(err.status ?? 500);
    if (err.headers) res.set(err.headers);
    res.send(err.message ?? 'error');
  };
  app.use(onError);
  return app;
}

function koaApp(job: HttpServerJob, redis: Redis, capacity: number, perMinute: number): http.RequestListener {
  const app = new Koa();
  let mw: Middleware | undefined;
  switch (job.variant) {
    case 'bare':
      break;
    case 'hasp':
      mw = haspKoa.rateLimit({ capacity, rate: `${perMinute}/min`, redis, key: (ctx) => header(ctx.headers) });
      break;
    case 'redis-get':
      mw = (ctx, next) => redis.get(header(ctx.headers) ?? '').then(next);
      break;
    case 'hasp-lock': {
      let n = 0;
      mw = haspKoa.withLock(() => `req:${++n}`, { redis });
      break;
    }
    case 'rlf': {
      // The Koa middleware from rate-limiter-flexible's README (with its in-memory block, as for Express).
      const limiter = rlfLimiter(redis, perMinute);
      mw = async (ctx, next) => {
        try {
          await limiter.consume(header(ctx.headers) ?? '');
        } catch {
          ctx.status = 429;
          ctx.body = 'Too Many Requests';
          return;
        }
        await next();
      };
      break;
    }
    case 'koa-ratelimit':
      mw = koaRatelimit({
        driver: 'redis',
        // @types/koa-ratelimit still names ioredis 4's class; the driver only calls multi/eval on it.
        db: redis as never,
        duration: 60_000,
        max: perMinute,
        id: (ctx) => header(ctx.headers) ?? '',
      }) as unknown as Middleware;
      break;
    default:
      throw new Error(`no Koa variant ${job.variant}`);
  }
  if (mw) app.use(mw);
  app.use((ctx) => {
    ctx.body = 'ok';
  });
  return app.callback();
}
