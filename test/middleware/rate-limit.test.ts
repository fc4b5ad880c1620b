// rateLimit() over real HTTP against a real Redis, for Express 4, Express 5, Koa 2 and Koa 3: budgets, the RateLimit
// fields, the 429 through the app's error handling, keys (client IP, proxies, IPv6), bad key/cost functions, and two
// app processes sharing one budget.
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as delay } from 'node:timers/promises';
import { TokenBucket } from '@hasp/core';
import type { Redis } from 'ioredis';
import { Readable } from 'node:stream';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { startRedis, stopAll, type RedisNode } from '../harness/redis.js';
import { bucketKey, uniquePrefix, until, within } from '../core/helpers.js';
import { trackUnhandled } from '../redlock/support.js';
import { deferred, FRAMEWORKS, framework, get, pipelined, type Framework, type Response, type RunningApp } from './apps.js';

const here = path.dirname(fileURLToPath(import.meta.url));

let node: RedisNode;
let redis: Redis;
const fileUnhandled = trackUnhandled();

beforeAll(async () => {
  node = await startRedis();
  redis = node.client();
});

afterAll(async () => {
  fileUnhandled.stop();
  await stopAll();
  expect(fileUnhandled.reasons).toEqual([]);
});

let policySeq = 0;
/** A policy name no other test uses: buckets built by the middleware are stored under it. */
function freshPolicy(tag: string): string {
  return `${tag}-${process.pid}-${++policySeq}`;
}

/** Whole tokens the bucket of `key` under `policy` holds now, read from Redis (a peek consumes nothing). */
async function remainingInRedis(policy: string, key: string, capacity: number, rate: number | string): Promise<number> {
  const bucket = new TokenBucket({ capacity, rate, redis, prefix: `hasp:tb:${policy}:` });
  // A peek answers what a take of one token would leave.
  const d = await bucket.peek(key);
  return d.allowed ? d.remaining + 1 : d.remaining;
}

async function keysOf(policy: string): Promise<string[]> {
  return redis.keys(`hasp:tb:${policy}:*`);
}

describe.each(FRAMEWORKS)('rateLimit on %s', (name) => {
  let fw: Framework;
  const apps: RunningApp[] = [];

  beforeAll(async () => {
    fw = await framework(name);
  });

  afterEach(async () => {
    await Promise.all(apps.splice(0).map((a) => a.close()));
  });

  async function start(spec: Parameters<Framework['start']>[0]): Promise<RunningApp> {
    const app = await fw.start(spec);
    apps.push(app);
    return app;
  }

  /** Sends `n` requests one after the other. */
  async function series(url: string, n: number, headers?: Record<string, string>): Promise<Response[]> {
    const out: Response[] = [];
    for (let i = 0; i < n; i++) out.push(await get(url, { headers }));
    return out;
  }

  it('lets capacity requests through, then answers 429 through the error handler; keys are separate', async () => {
    const policy = freshPolicy('basic');
    const app = await start({
      routes: {
        '/sms': {
          use: [fw.rateLimit({ capacity: 3, rate: '1/min', redis, policy, key: (r: { query: { to?: string } }) => r.query.to })],
          handle: (c) => ({ body: { remaining: c.rateLimit?.remaining } }),
        },
      },
    });
    const a = await series(`${app.url}/sms?to=a`, 4);
    expect(a.map((r) => r.status)).toEqual([200, 200, 200, 429]);
    expect(a.map((r) => r.body.remaining)).toEqual([2, 1, 0, undefined]);
    const denied = a[3]!;
    expect(denied.body.code).toBe('RATE_LIMITED');
    expect(denied.headers['ratelimit-policy']).toBe(`"${policy}";q=3;w=180`);
    expect(denied.headers.ratelimit).toMatch(new RegExp(`^"${policy}";r=0;t=\\d+$`));
    const t = Number(/t=(\d+)/.exec(String(denied.headers.ratelimit))![1]);
    const retryAfter = Number(denied.headers['retry-after']);
    expect(Number.isInteger(retryAfter)).toBe(true);
    expect(retryAfter).toBeGreaterThanOrEqual(t);
    expect(retryAfter).toBeGreaterThan(0);
    expect(retryAfter).toBeLessThanOrEqual(60);
    // The error reached the app's error handling as an exposed http-errors 429 carrying its headers.
    expect(app.errors).toHaveLength(1);
    expect(app.errors[0]).toMatchObject({ status: 429, expose: true, code: 'RATE_LIMITED' });
    expect(app.errors[0]!.headers?.['Retry-After']).toBe(String(retryAfter));
    // Another key has its own full bucket; the first stays empty.
    expect((await get(`${app.url}/sms?to=b`)).status).toBe(200);
    expect((await get(`${app.url}/sms?to=a`)).status).toBe(429);
    expect(await remainingInRedis(policy, 'b', 3, '1/min')).toBe(2);
  });

  it('sends the RateLimit fields exactly as the draft says (capacity 10, 2/s, policy sms, 3 left)', async () => {
    const policy = freshPolicy('sms');
    const app = await start({
      routes: {
        '/sms': {
          use: [
            fw.rateLimit({
              capacity: 10,
              rate: 2,
              redis,
              policy,
              key: 'one-phone',
              cost: async (r: { query: { cost?: string } }) => Number(r.query.cost ?? 1),
            }),
          ],
        },
      },
    });
    const first = await get(`${app.url}/sms?cost=7`);
    expect(first.status).toBe(200);
    expect(first.headers['ratelimit-policy']).toBe(`"${policy}";q=10;w=5`);
    expect(first.headers.ratelimit).toBe(`"${policy}";r=3;t=1`);
    const denied = await get(`${app.url}/sms?cost=10`);
    expect(denied.status).toBe(429);
    expect(denied.headers['ratelimit-policy']).toBe(`"${policy}";q=10;w=5`);
    const m = /^"[^"]+";r=(\d+);t=(\d+)$/.exec(String(denied.headers.ratelimit));
    expect(m).not.toBeNull();
    expect(Number(m![1])).toBeGreaterThanOrEqual(3);
    expect(Number(m![2])).toBe(1);
    // 10 tokens need the 7 taken back: 3.5 s at 2/s, minus what has refilled since; never below t.
    const retryAfter = Number(denied.headers['retry-after']);
    expect(retryAfter).toBeGreaterThanOrEqual(Number(m![2]));
    expect(retryAfter).toBeLessThanOrEqual(4);
    expect(retryAfter).toBeGreaterThanOrEqual(3);
  });

  it('keeps the fields on every response of the route, also through the default error handling', async () => {
    const policy = freshPolicy('dflt');
    const limit = fw.rateLimit({ capacity: 2, rate: '1/h', redis, policy, key: 'k' });
    const app = await start({
      errors: 'default',
      routes: {
        '/boom': {
          use: [limit],
          handle: () => {
            throw Object.assign(new Error('handler failed'), { status: 500 });
          },
        },
      },
    });
    const [failed, , denied] = await series(`${app.url}/boom`, 3);
    expect(failed!.status).toBe(500);
    expect(failed!.headers['ratelimit-policy']).toBe(`"${policy}";q=2;w=7200`);
    expect(failed!.headers.ratelimit).toMatch(new RegExp(`^"${policy}";r=1;t=\\d+$`));
    expect(denied!.status).toBe(429);
    expect(Number(denied!.headers['retry-after'])).toBeGreaterThan(0);
    expect(denied!.headers['ratelimit-policy']).toBe(`"${policy}";q=2;w=7200`);
    expect(denied!.headers.ratelimit).toMatch(new RegExp(`^"${policy}";r=0;t=\\d+$`));
  });

  it('lists one member per policy when two limiters guard a route, also on a denial by the second', async () => {
    const minute = freshPolicy('minute');
    const day = freshPolicy('day');
    const app = await start({
      routes: {
        '/x': {
          use: [
            fw.rateLimit({ capacity: 5, rate: '5/min', redis, policy: minute, key: 'k' }),
            fw.rateLimit({ capacity: 2, rate: '2/d', redis, policy: day, key: 'k' }),
          ],
        },
      },
    });
    const [ok, , denied] = await series(`${app.url}/x`, 3);
    expect(ok!.status).toBe(200);
    expect(ok!.headers['ratelimit-policy']).toBe(`"${minute}";q=5;w=60, "${day}";q=2;w=86400`);
    expect(ok!.headers.ratelimit).toMatch(new RegExp(`^"${minute}";r=4;t=\\d+, "${day}";r=1;t=\\d+$`));
    expect(denied!.status).toBe(429);
    expect(denied!.headers['ratelimit-policy']).toBe(`"${minute}";q=5;w=60, "${day}";q=2;w=86400`);
    expect(denied!.headers.ratelimit).toMatch(new RegExp(`^"${minute}";r=2;t=\\d+, "${day}";r=0;t=\\d+$`));
    expect(Number(denied!.headers['retry-after'])).toBeGreaterThan(3_600);
  });

  describe('a request one limiter refuses costs nothing in the limiters before it', () => {
    const phone = (r: { query: { phone?: string } }) => r.query.phone;
    const statuses = async (url: string, phones: string[]) => {
      const out: number[] = [];
      for (const p of phones) out.push((await get(`${url}?phone=${p}`)).status);
      return out;
    };

    /** `/sms` behind the `client` bucket (one budget for every request), then a per-phone limit of 1 per hour. */
    function smsApp(client: TokenBucket, perPhone: Record<string, unknown>): Promise<RunningApp> {
      return start({
        routes: {
          '/sms': {
            use: [
              fw.rateLimit({ bucket: client, policy: 'client', key: 'client' }),
              fw.rateLimit({ capacity: 1, rate: '1/h', key: phone, ...perPhone }),
            ],
          },
        },
      });
    }

    /**
     * `/sms` behind the `client` bucket and a per-phone limit of 1, whose key function holds a request with `hold` in its
     * query (after the client's take) until `open()`; `reached` resolves when one is held.
     */
    async function heldRoute(client: TokenBucket): Promise<{ url: string; reached: Promise<void>; open: () => void }> {
      const reached = deferred();
      const gate = deferred();
      const held = async (r: { query: { phone?: string; hold?: string } }) => {
        if (r.query.hold !== undefined) {
          reached.resolve();
          await gate.promise;
        }
        return r.query.phone;
      };
      const app = await smsApp(client, { redis, policy: freshPolicy('phone'), key: held });
      return { url: `${app.url}/sms`, reached: reached.promise, open: () => gate.resolve() };
    }

    it('on Redis: the earlier take goes back, and a shortage it left in memory is forgotten', async () => {
      const ip = freshPolicy('ip');
      const perPhone = freshPolicy('phone');
      const app = await start({
        routes: {
          '/sms': {
            use: [
              fw.rateLimit({ capacity: 2, rate: '2/h', redis, policy: ip, key: 'client' }),
              fw.rateLimit({ capacity: 1, rate: '1/h', redis, policy: perPhone, key: phone }),
            ],
          },
        },
      });
      // Phone 1 once, then refused by its own limit three times: the client's limit must not pay for those. The second
      // request empties the client's bucket before the phone limit refuses it, which the client's limiter remembers as a
      // shortage (answered from memory): giving the token back must make it ask Redis again.
      expect(await statuses(`${app.url}/sms`, ['1', '1', '1', '1'])).toEqual([200, 429, 429, 429]);
      expect(app.errors.map((e) => e.code)).toEqual(['RATE_LIMITED', 'RATE_LIMITED', 'RATE_LIMITED']);
      expect(await remainingInRedis(ip, 'client', 2, '2/h')).toBe(1);
      expect(await statuses(`${app.url}/sms`, ['2', '3'])).toEqual([200, 429]);
      expect(await remainingInRedis(ip, 'client', 2, '2/h')).toBe(0);
      expect(await remainingInRedis(perPhone, '3', 1, '1/h')).toBe(1); // refused by the client's limit: untouched
    });

    it('in memory, also when the refusal is answered by a custom handler', async () => {
      const handler =
        fw.kind === 'express'
          ? (_req: unknown, res: { status(n: number): { json(b: unknown): void } }) => res.status(429).json({ custom: true })
          : (ctx: { status: number; body: unknown }) => {
              ctx.status = 429;
              ctx.body = { custom: true };
            };
      const client = new TokenBucket({ capacity: 3, rate: '3/h' });
      const app = await smsApp(client, { policy: 'phone', handler });
      expect(await statuses(`${app.url}/sms`, ['1', '1', '1', '1', '1'])).toEqual([200, 429, 429, 429, 429]);
      expect((await client.peek('client')).remaining).toBe(1); // 2 tokens left: what a take of one would leave
      expect(await statuses(`${app.url}/sms`, ['2', '3', '4'])).toEqual([200, 200, 429]);
      // Only the last refusal is the client limit's (through the error handling); the phone limit's went to its handler.
      expect(app.errors.map((e) => [e.code, e.headers?.RateLimit])).toEqual([['RATE_LIMITED', '"client";r=0;t=1200']]);
    });

    it('gives back what the limits before it took when a later one cannot decide (a bad key, Redis down under closed)', async () => {
      const client = new TokenBucket({ capacity: 2, rate: '2/h' });
      const down = await startRedis();
      const downClient = down.client();
      try {
        const app = await start({
          routes: {
            '/sms': {
              use: [
                fw.rateLimit({ bucket: client, policy: 'client', key: 'client' }),
                fw.rateLimit({
                  capacity: 1,
                  rate: '1/h',
                  policy: 'phone',
                  key: (r: { query: { phone?: string } }) => {
                    if (r.query.phone === 'bad') throw new Error('no phone number');
                    return r.query.phone;
                  },
                }),
              ],
            },
            '/closed': {
              use: [
                fw.rateLimit({ bucket: client, policy: 'client', key: 'client' }),
                fw.rateLimit({ capacity: 1, rate: '1/h', redis: downClient, policy: 'phone', key: phone, onStoreError: 'closed' }),
              ],
            },
          },
        });
        await down.kill();
        expect(await statuses(`${app.url}/sms`, ['bad', 'bad', 'bad'])).toEqual([500, 500, 500]);
        expect(await statuses(`${app.url}/closed`, ['1', '2', '3'])).toEqual([503, 503, 503]);
        // None of those six cost the client anything: two numbers still pass.
        expect(await statuses(`${app.url}/sms`, ['1', '2', '3'])).toEqual([200, 200, 429]);
      } finally {
        await down.stop();
      }
    });

    it('gives nothing back to a limiter with giveBack: false, a flood guard that bounds refused requests too', async () => {
      const perIp = new TokenBucket({ capacity: 3, rate: '3/h' });
      const app = await start({
        routes: {
          '/sms': {
            use: [
              fw.rateLimit({ bucket: perIp, policy: 'ip', key: 'ip', giveBack: false }),
              fw.rateLimit({ capacity: 1, rate: '1/h', policy: 'phone', key: phone }),
            ],
          },
        },
      });
      // The number's second and third requests are refused by its limit, and still count against the client's.
      expect(await statuses(`${app.url}/sms`, ['1', '1', '1', '2'])).toEqual([200, 429, 429, 429]);
      expect((await perIp.peek('ip')).remaining).toBe(0);
    });

    it('gives back what the limits before a withLock took when it refuses the request (a double click gets 423)', async () => {
      const perUser = new TokenBucket({ capacity: 3, rate: '3/h' });
      const started = deferred();
      const finish = deferred();
      const app = await start({
        routes: {
          '/buy': {
            use: [fw.rateLimit({ bucket: perUser, policy: 'user', key: 'user' }), fw.withLock(() => 'order')],
            handle: async (call) => {
              if (call.query.hold !== undefined) {
                started.resolve();
                await finish.promise;
              }
              return undefined;
            },
          },
        },
      });
      const first = get(`${app.url}/buy?hold=1`);
      await within(started.promise, 5_000, 'the first purchase');
      // Two more clicks while the first is paying: both 423, and neither counts in the user's limit.
      expect(await statuses(`${app.url}/buy`, ['x', 'x'])).toEqual([423, 423]);
      finish.resolve();
      expect((await first).status).toBe(200);
      expect(await statuses(`${app.url}/buy`, ['x', 'x', 'x'])).toEqual([200, 200, 429]);
    });

    // Only Express hands the handler a `next`.
    if (name.startsWith('express')) {
      const softHandlers: [string, (req: unknown, res: unknown, next: () => void) => unknown][] = [
        ['at once', (_req, _res, next) => next()],
        ['from a callback, after returning', (_req, _res, next) => void setTimeout(next, 5)],
        ['after an await', async (_req, _res, next) => {
          await delay(5);
          next();
        }],
      ];
      it.each(softHandlers)('gives nothing back when an Express handler lets the refused request through (%s)', async (_how, soft) => {
        // A "log only" limit: its handler calls next(), so the request goes on and counts in the limits before it.
        const client = new TokenBucket({ capacity: 3, rate: '3/h' });
        const app = await smsApp(client, { policy: 'phone', handler: soft });
        expect(await statuses(`${app.url}/sms`, ['1', '1', '1', '1'])).toEqual([200, 200, 200, 429]);
        expect((await client.peek('client')).allowed).toBe(false);
      });
    }

    if (name.startsWith('express')) {
      it('gives back when a custom handler answers a pipelined refusal whose client leaves before its turn', async () => {
        const client = new TokenBucket({ capacity: 5, rate: '5/h' });
        const answered = deferred();
        const gate = deferred();
        const app = await start({
          routes: {
            '/slow': { express: (_req, res) => void gate.promise.then(() => res.end('slow')) },
            '/sms': {
              use: [
                fw.rateLimit({ bucket: client, policy: 'client', key: 'client' }),
                fw.rateLimit({
                  capacity: 1,
                  rate: '1/h',
                  key: phone,
                  policy: 'phone',
                  handler: (_req: unknown, res: { status(n: number): { end(): void } }) => {
                    res.status(429).end();
                    answered.resolve();
                  },
                }),
              ],
            },
          },
        });
        expect(await statuses(`${app.url}/sms`, ['1'])).toEqual([200]);
        // The refusal's response waits behind /slow's, and never gets its turn: the client leaves first.
        const socket = await pipelined(app.url, ['/slow', '/sms?phone=1']);
        await within(answered.promise, 5_000, 'the handler to answer');
        socket.destroy();
        await until(async () => (await client.peek('client')).remaining === 3, 2_000, 'the take to come back');
        gate.resolve();
      });
    }

    it.each(['Redis', 'memory'] as const)('keeps the take spent once another request took from the same bucket after it (%s)', async (where) => {
      const client = new TokenBucket({ capacity: 5, rate: '5/h', redis: where === 'Redis' ? redis : undefined, prefix: `hasp:tb:${freshPolicy('ip')}:` });
      const route = await heldRoute(client);
      expect(await statuses(route.url, ['1'])).toEqual([200]);
      // Another request for phone 1 takes from the client's bucket, then waits in the phone limit's key function...
      const refused = get(`${route.url}?phone=1&hold=1`);
      await route.reached;
      // ... while one for phone 2 takes from the client's bucket too, on top of it.
      expect(await statuses(route.url, ['2'])).toEqual([200]);
      route.open();
      expect((await refused).status).toBe(429);
      // Giving the first take back now would erase part of the second: both stay spent (3 taken, 2 left).
      expect((await client.peek('client')).remaining).toBe(1);
    });

    it.each(['Redis', 'memory'] as const)('never gives back more than was taken under 96 concurrent requests (%s)', async (where) => {
      const store = where === 'Redis' ? redis : undefined;
      const client = new TokenBucket({ capacity: 100, rate: '100/h', redis: store, prefix: `hasp:tb:${freshPolicy('ip')}:` });
      const app = await smsApp(client, { redis: store, policy: freshPolicy('phone') });
      // All at once: 84 requests for 6 numbers, then one for each of 12 new numbers. Every request takes from the
      // client's bucket (it holds 100); the per-phone limit lets one per number through and refuses the rest, whose
      // give-backs race the takes of the requests after them, among them the new numbers' that go through.
      const phones = Array.from({ length: 96 }, (_, i) => (i < 84 ? i % 6 : i - 78));
      const responses = await Promise.all(phones.map((p) => get(`${app.url}/sms?phone=${p}`)));
      expect(responses.filter((r) => r.status === 200)).toHaveLength(18);
      expect(responses.filter((r) => r.status !== 200 && r.status !== 429)).toEqual([]);
      // Each of the 18 that went through keeps its token: a give-back that undid a later take would leave more.
      const peek = await client.peek('client'); // what a take of one would decide, and leave
      expect(peek.allowed ? peek.remaining + 1 : 0).toBeLessThanOrEqual(100 - 18);
    });

    it('answers the refusal within the bucket timeout when the earlier store stops answering, and goes on', async () => {
      const other = await startRedis();
      const otherClient = other.client();
      try {
        const client = new TokenBucket({ capacity: 5, rate: '5/h', redis: otherClient, prefix: `hasp:tb:${freshPolicy('ip')}:`, timeout: 300 });
        const route = await heldRoute(client);
        expect(await statuses(route.url, ['1'])).toEqual([200]);
        const refused = get(`${route.url}?phone=1&hold=1`);
        await route.reached;
        other.pause();
        route.open();
        const started = Date.now();
        expect((await refused).status).toBe(429);
        expect(Date.now() - started).toBeLessThan(3_000);
        other.resume();
        // The give-back was cut off (the take stays spent, or lands late); the route keeps working either way.
        expect(await statuses(route.url, ['2'])).toEqual([200]);
      } finally {
        await other.stop();
      }
    });
  });

  it('keeps the fields on a 423 from a withLock behind the limiter', async () => {
    const policy = freshPolicy('lock');
    for (const errors of ['json', 'default'] as const) {
      const started = deferred();
      const finish = deferred();
      const app = await start({
        errors,
        routes: {
          '/buy': {
            use: [fw.rateLimit({ capacity: 10, rate: '1/h', redis, policy: `${policy}-${errors}`, key: 'k' }), fw.withLock(() => `${policy}-${errors}`)],
            handle: async () => {
              started.resolve();
              await finish.promise;
              return undefined;
            },
          },
        },
      });
      const first = get(`${app.url}/buy`);
      await within(started.promise, 5_000, 'the first handler');
      const busy = await get(`${app.url}/buy`);
      expect(busy.status).toBe(423);
      expect(Number(busy.headers['retry-after'])).toBeGreaterThanOrEqual(1);
      expect(busy.headers['ratelimit-policy']).toBe(`"${policy}-${errors}";q=10;w=36000`);
      expect(busy.headers.ratelimit).toMatch(/;r=8;t=\d+$/);
      finish.resolve();
      expect((await first).headers.ratelimit).toMatch(/;r=9;t=\d+$/);
    }
  });

  it('answers denied requests with the handler option; headers: false drops the fields but not Retry-After', async () => {
    const policy = freshPolicy('handler');
    const handler =
      fw.kind === 'express'
        ? (_req: unknown, res: { status(n: number): { json(b: unknown): void } }, _next: unknown, d: { retryAfter: number }) =>
            res.status(503).json({ custom: true, retryAfter: d.retryAfter > 0 })
        : (ctx: { status: number; body: unknown }, d: { retryAfter: number }) => {
            ctx.status = 503;
            ctx.body = { custom: true, retryAfter: d.retryAfter > 0 };
          };
    const app = await start({
      routes: {
        '/custom': { use: [fw.rateLimit({ capacity: 1, rate: '1/h', redis, policy, key: 'k', handler })] },
        '/quiet': { use: [fw.rateLimit({ capacity: 1, rate: '1/h', redis, policy: `${policy}-q`, key: 'k', headers: false })] },
      },
    });
    const [ok, custom] = await series(`${app.url}/custom`, 2);
    expect(ok!.status).toBe(200);
    expect(custom!.status).toBe(503);
    expect(custom!.body).toEqual({ custom: true, retryAfter: true });
    expect(custom!.headers['retry-after']).toBeDefined();
    expect(custom!.headers.ratelimit).toMatch(/;r=0;t=\d+$/);
    expect(app.errors).toHaveLength(0);
    const [quietOk, quietDenied] = await series(`${app.url}/quiet`, 2);
    expect(quietOk!.status).toBe(200);
    expect(quietOk!.headers.ratelimit).toBeUndefined();
    expect(quietOk!.headers['ratelimit-policy']).toBeUndefined();
    expect(quietDenied!.status).toBe(429);
    expect(quietDenied!.headers.ratelimit).toBeUndefined();
    expect(Number(quietDenied!.headers['retry-after'])).toBeGreaterThan(0);
  });

  it('keeps the fields and Retry-After on the 429 a custom handler answers by throwing, through the default error handling', async () => {
    const policy = freshPolicy('thrown');
    const slowDown = Object.assign(new Error('slow down'), { status: 429, expose: true });
    const handler =
      fw.kind === 'express'
        ? (_req: unknown, _res: unknown, next: (err: unknown) => void) => next(slowDown)
        : (ctx: { throw(status: number, message: string): never }) => ctx.throw(429, 'slow down');
    const app = await start({ routes: { '/x': { use: [fw.rateLimit({ capacity: 1, rate: '1/h', redis, policy, key: 'k', handler })] } }, errors: 'default' });
    const [ok, denied] = await series(`${app.url}/x`, 2);
    expect(ok!.status).toBe(200);
    expect(denied!.status).toBe(429);
    expect(denied!.headers['ratelimit-policy']).toBe(`"${policy}";q=1;w=3600`);
    expect(denied!.headers.ratelimit).toMatch(new RegExp(`^"${policy}";r=0;t=\\d+$`));
    expect(Number(denied!.headers['retry-after'])).toBeGreaterThan(0);
  });

  it.runIf(name === 'koa2')('keeps the fields on the 500 Koa answers for a body stream that fails before its first byte', async () => {
    const policy = freshPolicy('stream');
    const app = await start({
      routes: {
        '/x': {
          use: [fw.rateLimit({ capacity: 5, rate: '1/h', redis, policy, key: 'k' })],
          koa: (ctx: { body: unknown }) => {
            ctx.body = new Readable({
              read() {
                this.destroy(new Error('the file went away'));
              },
            });
          },
        },
      },
      errors: 'default',
    });
    const [failed] = await series(`${app.url}/x`, 1);
    expect(failed!.status).toBe(500);
    expect(failed!.headers['ratelimit-policy']).toBe(`"${policy}";q=5;w=18000`);
    expect(failed!.headers.ratelimit).toMatch(new RegExp(`^"${policy}";r=4;t=\\d+$`));
  });

  // Most error pages send none of err.headers: a 429's and a 503's Retry-After are on the response already.
  it('keeps Retry-After on a 429 and on a 503 under closed through an error page that sends none of err.headers', async () => {
    const down = await startRedis();
    const downClient = down.client();
    try {
      const app = await start({
        errors: 'page',
        routes: {
          '/limited': { use: [fw.rateLimit({ capacity: 1, rate: '1/h', policy: 'page', key: 'k' })] },
          '/closed': { use: [fw.rateLimit({ capacity: 1, rate: '1/h', redis: downClient, policy: 'page-closed', key: 'k', onStoreError: 'closed' })] },
        },
      });
      await down.kill();
      const [, limited] = await series(`${app.url}/limited`, 2);
      const closed = await get(`${app.url}/closed`);
      expect([limited!.status, limited!.body, closed.status, closed.body]).toEqual([429, 'Sorry', 503, 'Sorry']);
      for (const r of [limited!, closed]) expect(Number(r.headers['retry-after']), String(r.status)).toBeGreaterThanOrEqual(1);
    } finally {
      await down.stop();
    }
  });

  it('skips limiting when the key is undefined, and shares a prepared bucket between routes', async () => {
    const policy = freshPolicy('shared');
    const bucket = new TokenBucket({ capacity: 3, rate: '1/h', redis, prefix: `hasp:tb:${policy}:` });
    const key = async (r: { query: { user?: string } }) => r.query.user;
    const app = await start({
      routes: {
        '/a': { use: [fw.rateLimit({ bucket, key, policy })], handle: (c) => ({ body: { limited: c.rateLimit !== undefined } }) },
        '/b': { use: [fw.rateLimit({ bucket, key, policy })] },
      },
    });
    const anon = await series(`${app.url}/a`, 5);
    expect(anon.map((r) => r.status)).toEqual([200, 200, 200, 200, 200]);
    expect(anon[0]!.body).toEqual({ limited: false });
    expect(anon[0]!.headers.ratelimit).toBeUndefined();
    const statuses = [
      (await get(`${app.url}/a?user=u`)).status,
      (await get(`${app.url}/b?user=u`)).status,
      (await get(`${app.url}/a?user=u`)).status,
      (await get(`${app.url}/b?user=u`)).status,
    ];
    expect(statuses).toEqual([200, 200, 200, 429]);
  });

  it('passes a request on when an earlier middleware already sent the response, and refuses the next one, with no unhandled rejection', async () => {
    const early =
      fw.kind === 'express'
        ? (_req: unknown, res: { end(body: string): void }, next: () => void) => {
            res.end('early');
            next();
          }
        : (ctx: { res: { end(body: string): void } }, next: () => Promise<void>) => {
            ctx.res.end('early');
            return next();
          };
    const unhandled = trackUnhandled();
    try {
      let ran = 0;
      const app = await start({
        errors: 'default',
        routes: {
          '/x': {
            use: [early, fw.rateLimit({ capacity: 1, rate: '1/h', redis, policy: freshPolicy('early'), key: 'k' })],
            handle: () => {
              ran++;
              return { end: false };
            },
          },
        },
      });
      const r = await get(`${app.url}/x`);
      // (Koa starts every response as a 404 until a body is set.)
      expect(r.status).toBe(fw.kind === 'express' ? 200 : 404);
      expect(r.body).toBe('early');
      expect(r.headers['ratelimit']).toBeUndefined();
      // The fields could not be written: no reason to fail the request, whose handler runs as without the limiter.
      await until(() => ran === 1, 2_000, 'the handler to run');
      expect(app.errors).toEqual([]);
      // Over the budget: the 429 goes to the app's error handling, which finds the response sent.
      expect((await get(`${app.url}/x`)).body).toBe('early');
      await until(() => app.errors.length > 0, 2_000, 'the refusal to reach the app');
      expect(app.errors.map((e) => e.code)).toEqual(['RATE_LIMITED']);
      expect(ran).toBe(1);
      expect(unhandled.reasons).toEqual([]);
    } finally {
      unhandled.stop();
    }
  });

  it('grants exactly capacity requests out of many concurrent ones', async () => {
    const policy = freshPolicy('burst');
    const app = await start({ routes: { '/x': { use: [fw.rateLimit({ capacity: 5, rate: '1/h', redis, policy, key: 'k' })] } } });
    const all = await within(Promise.all(Array.from({ length: 30 }, () => get(`${app.url}/x`))), 10_000, '30 concurrent requests');
    expect(all.filter((r) => r.status === 200)).toHaveLength(5);
    expect(all.filter((r) => r.status === 429)).toHaveLength(25);
  });

  it('answers 500 through the error handler for a bad key or cost, and writes nothing', async () => {
    const policy = freshPolicy('badkey');
    const keys: Record<string, (r: unknown) => unknown> = {
      throws: () => {
        throw new Error('no user');
      },
      rejects: async () => {
        throw new Error('no user');
      },
      number: () => 42,
      empty: () => '',
      object: async () => ({ id: 1 }),
      null: () => null,
    };
    const routes: Record<string, { use: unknown[] }> = {};
    for (const [k, fn] of Object.entries(keys)) routes[`/${k}`] = { use: [fw.rateLimit({ capacity: 1, rate: '1/h', redis, policy, key: fn })] };
    routes['/cost-nan'] = { use: [fw.rateLimit({ capacity: 1, rate: '1/h', redis, policy, key: 'c', cost: () => NaN })] };
    routes['/cost-big'] = { use: [fw.rateLimit({ capacity: 1, rate: '1/h', redis, policy, key: 'c', cost: async () => 2 })] };
    routes['/cost-throws'] = {
      use: [
        fw.rateLimit({
          capacity: 1,
          rate: '1/h',
          redis,
          policy,
          key: 'c',
          cost: () => {
            throw new Error('bad');
          },
        }),
      ],
    };
    const app = await start({ routes });
    for (const path of Object.keys(routes)) {
      // Twice: a first bad request must not have consumed the single token.
      for (let i = 0; i < 2; i++) {
        const r = await get(`${app.url}${path}`);
        expect(r.status, path).toBe(500);
        expect(r.body.code, path).toBe(path.startsWith('/cost') ? 'INVALID_COST' : 'INVALID_KEY');
        expect(r.headers.ratelimit, path).toBeUndefined();
      }
    }
    expect(app.errors.every((e) => e.status === 500 && e.expose === false)).toBe(true);
    expect(await keysOf(policy)).toEqual([]);
  });

  describe('default key: the client IP', () => {
    const limiter = (policy: string) => fw.rateLimit({ capacity: 2, rate: '1/h', redis, policy });

    it('ignores spoofed X-Forwarded-For and Forwarded without trust proxy', async () => {
      const policy = freshPolicy('spoof');
      const app = await start({ routes: { '/x': { use: [limiter(policy)] } } });
      const statuses: number[] = [];
      for (let i = 0; i < 6; i++) {
        const headers: Record<string, string> =
          i % 2 === 0 ? { 'X-Forwarded-For': `203.0.113.${i}` } : { Forwarded: `for=198.51.100.${i}`, 'X-Real-IP': `192.0.2.${i}` };
        statuses.push((await get(`${app.url}/x`, { headers })).status);
      }
      expect(statuses).toEqual([200, 200, 429, 429, 429, 429]);
      expect(await remainingInRedis(policy, '127.0.0.1', 2, '1/h')).toBe(0);
      expect(await keysOf(policy)).toHaveLength(1);
    });

    it('uses X-Forwarded-For with trust proxy (never Forwarded), IPv4-mapped as IPv4 and IPv6 by /64', async () => {
      const policy = freshPolicy('proxy');
      const app = await start({ trustProxy: true, routes: { '/x': { use: [limiter(policy)] } } });
      const from = async (xff: string | undefined, extra: Record<string, string> = {}) =>
        (await get(`${app.url}/x`, { headers: { ...(xff === undefined ? {} : { 'X-Forwarded-For': xff }), ...extra } })).status;
      // Two clients behind the proxy: separate budgets.
      expect([await from('203.0.113.1'), await from('203.0.113.1'), await from('203.0.113.1')]).toEqual([200, 200, 429]);
      expect(await from('203.0.113.2')).toBe(200);
      // The IPv4-mapped spelling is the same client.
      expect(await from('::ffff:203.0.113.2')).toBe(200);
      expect(await from('203.0.113.2')).toBe(429);
      // One /64 is one client, whichever interface id it picks.
      expect(await from('2001:db8:1:2::1')).toBe(200);
      expect(await from('2001:db8:1:2:aaaa:bbbb:cccc:dddd')).toBe(200);
      expect(await from('2001:DB8:1:2::ffff')).toBe(429);
      expect(await from('2001:db8:1:3::1')).toBe(200);
      // Forwarded is not what either framework reads: it cannot open a fresh bucket.
      expect([await from(undefined, { Forwarded: 'for=192.0.2.1' }), await from(undefined, { Forwarded: 'for=192.0.2.2' })]).toEqual([
        200, 200,
      ]);
      expect(await from(undefined, { Forwarded: 'for=192.0.2.3' })).toBe(429);
      expect(await remainingInRedis(policy, '2001:db8:1:2::/64', 2, '1/h')).toBe(0);
      expect(await remainingInRedis(policy, '203.0.113.2', 2, '1/h')).toBe(0);
    });

    it('keys a client on ::1 by its /64 and one on ::ffff:127.0.0.1 as 127.0.0.1', async () => {
      const policy = freshPolicy('v6');
      const v6 = await start({ host: '::1', routes: { '/x': { use: [limiter(policy)] } } });
      expect((await get(`${v6.url}/x`)).status).toBe(200);
      expect(await remainingInRedis(policy, '0:0:0:0::/64', 2, '1/h')).toBe(1);
      const mapped = await start({ host: '::ffff:127.0.0.1', routes: { '/x': { use: [limiter(policy)] } } });
      const r = await get(`http://127.0.0.1:${mapped.port}/x`);
      expect(r.status).toBe(200);
      expect(await remainingInRedis(policy, '127.0.0.1', 2, '1/h')).toBe(1);
      const settings = { capacity: 2, rate: 1 / 3600 };
      expect((await keysOf(policy)).sort()).toEqual(
        ['0:0:0:0::/64', '127.0.0.1'].map((key) => bucketKey(settings, `hasp:tb:${policy}:`, key)).sort(),
      );
    });
  });

  it('sends the lock’s release to Redis before the response: the client’s next request, through another process, gets in', async () => {
    const child = await startChild(name, node.port, freshPolicy('order'));
    try {
      const lockApp = await start({ routes: { '/buy': { use: [fw.withLock((r: { query: { order?: string } }) => r.query.order, { redis })] } } });
      for (let i = 0; i < 4; i++) {
        const order = `${uniquePrefix('quick')}-${i}`;
        // The other process answers, then stays busy for 100 ms: a release left for later would go out after that.
        expect((await get(`${child.url}/quick?order=${order}&ms=100`)).status).toBe(200);
        const next = await get(`${lockApp.url}/buy?order=${order}`);
        expect(next.status).toBe(200);
      }
    } finally {
      await child.stop();
    }
  });

  it('shares one budget and one lock between two app processes on one Redis', async () => {
    const policy = freshPolicy('procs');
    const child = await startChild(name, node.port, policy);
    try {
      const app = await start({
        routes: { '/limited': { use: [fw.rateLimit({ capacity: 6, rate: '1/h', redis, policy, key: (r: { query: { k?: string } }) => r.query.k })] } },
      });
      const urls = [`${app.url}/limited?k=shared`, `${child.url}/limited?k=shared`];
      const statuses: number[] = [];
      for (let i = 0; i < 10; i++) statuses.push((await get(urls[i % 2]!)).status);
      expect(statuses).toEqual([200, 200, 200, 200, 200, 200, 429, 429, 429, 429]);
      // The child answered half of them, from the same Redis budget.
      expect((await get(`${child.url}/limited?k=other`)).status).toBe(200);
      expect(await remainingInRedis(policy, 'other', 6, '1/h')).toBe(5);

      // And one lock: while the other process's handler holds an order, this process answers 423 for it.
      const order = `${policy}-order`;
      const lockApp = await start({ routes: { '/buy': { use: [fw.withLock((r: { query: { order?: string } }) => r.query.order, { redis })] } } });
      const remote = get(`${child.url}/buy?order=${order}`);
      await until(async () => (await redis.exists(`hasp:lock:{${order}}`)) === 1, 5_000, 'the other process to lock');
      const busy = await get(`${lockApp.url}/buy?order=${order}`);
      expect(busy.status).toBe(423);
      expect(busy.body.code).toBe('LOCK_BUSY');
      expect((await get(`${child.url}/release?order=${order}`)).status).toBe(200);
      expect((await within(remote, 5_000, 'the other process to answer')).status).toBe(200);
      // The release is on its way to Redis before that answer is; it lands first unless it needs a second round trip
      // (the first release on a server that does not know the script yet: EVALSHA, NOSCRIPT, EVAL).
      await until(async () => (await get(`${lockApp.url}/buy?order=${order}`)).status === 200, 2_000, 'the lock to be free here', 10);
    } finally {
      await child.stop();
    }
  });
});

/** Runs test/middleware/app-process.ts in a child process: an app of `name` limiting /limited on Redis `port`. */
async function startChild(name: string, port: number, policy: string): Promise<{ url: string; stop(): Promise<void> }> {
  const child: ChildProcess = spawn(process.execPath, ['--import', 'tsx', path.join(here, 'app-process.ts'), name, String(port), policy], {
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const stop = async (): Promise<void> => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
    await exited;
  };
  try {
    const url = await within(
      new Promise<string>((resolve, reject) => {
        const lines = createInterface({ input: child.stdout! });
        lines.on('line', (line) => {
          if (line.startsWith('LISTENING ')) resolve(line.slice('LISTENING '.length));
        });
        child.once('exit', (code) => reject(new Error(`app process exited (${code}) before listening`)));
      }),
      20_000,
      'the app process to listen',
    );
    return { url, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}
