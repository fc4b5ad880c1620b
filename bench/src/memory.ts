// Memory cases, each run in a forked child: the Redis bytes one key of each limiter (and lock) takes, and the Node heap
// of the in-memory limiters after a million requests spread over many keys.
import http from 'node:http';
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { RedisLock, TokenBucket } from '@hasp/core';
import * as haspExpress from '@hasp/express';
import * as haspKoa from '@hasp/koa';
import express from 'express';
import type { Options as ErlOptions } from 'express-rate-limit';
import { Redis } from 'ioredis';
import Koa from 'koa';
import koaRatelimit from 'koa-ratelimit';
import { RedisStore, type RedisReply } from 'rate-limit-redis';
import { RateLimiterRedis } from 'rate-limiter-flexible';
import { Mutex } from 'redis-semaphore';
import Redlock5 from 'redlock5';

const USER = 'user:12345';

export interface RedisMemoryRow {
  what: string;
  kind: 'bucket' | 'lock';
  /** Redis keys the operation left behind (names), and their summed MEMORY USAGE after 1 and after 50 takes. */
  keys: string[];
  bytesAfter1: number;
  bytesAfter50: number | null;
}

async function usage(redis: Redis): Promise<{ keys: string[]; bytes: number }> {
  const keys = (await redis.keys('*')).sort();
  let bytes = 0;
  for (const k of keys) bytes += Number(await redis.call('MEMORY', 'USAGE', k, 'SAMPLES', '0'));
  return { keys, bytes };
}

export async function runRedisMemory(job: { port: number }): Promise<RedisMemoryRow[]> {
  const redis = new Redis({ port: job.port, host: '127.0.0.1' });
  const limit = { capacity: 100, perMinute: 100 };
  const store = new RedisStore({ sendCommand: (command: string, ...args: string[]) => redis.call(command, ...args) as Promise<RedisReply> });
  store.init({ windowMs: 60_000 } as ErlOptions);
  const bucket = new TokenBucket({ capacity: limit.capacity, rate: `${limit.perMinute}/min`, redis });
  const rlf = new RateLimiterRedis({ storeClient: redis, points: limit.perMinute, duration: 60 });
  const koaMw = koaRatelimit({ driver: 'redis', db: redis as never, duration: 60_000, max: limit.perMinute, id: () => USER });
  const fakeCtx = () => ({ set: () => undefined, state: {} }) as unknown as Koa.Context;
  const buckets: [string, () => Promise<unknown>][] = [
    ['hasp TokenBucket', () => bucket.take(USER)],
    ['express-rate-limit + rate-limit-redis', () => store.increment(USER)],
    ['rate-limiter-flexible (RateLimiterRedis)', () => rlf.consume(USER)],
    ['koa-ratelimit', () => koaMw(fakeCtx(), async () => undefined)],
  ];
  const rows: RedisMemoryRow[] = [];
  for (const [what, take] of buckets) {
    await redis.flushall();
    await take();
    const one = await usage(redis);
    for (let i = 1; i < 50; i++) await take();
    const fifty = await usage(redis);
    rows.push({ what, kind: 'bucket', keys: one.keys, bytesAfter1: one.bytes, bytesAfter50: fifty.bytes });
  }
  const hasp = new RedisLock(redis, { ttl: 10_000 });
  const redlock = new Redlock5([redis]);
  redlock.on('error', () => undefined);
  const locks: [string, () => Promise<unknown>][] = [
    ['hasp RedisLock (held)', () => hasp.acquire(USER)],
    ['redlock 5.0.0-beta.2 (held)', () => redlock.acquire([USER], 10_000)],
    ['redis-semaphore Mutex (held)', () => new Mutex(redis, USER, { lockTimeout: 10_000 }).acquire()],
  ];
  for (const [what, take] of locks) {
    await redis.flushall();
    await take();
    const one = await usage(redis);
    rows.push({ what, kind: 'lock', keys: one.keys, bytesAfter1: one.bytes, bytesAfter50: null });
  }
  hasp.close();
  await redis.flushall();
  redis.disconnect();
  return rows;
}

export interface HeapRow {
  what: string;
  requests: number;
  keys: number;
  /** heapUsed in MB: after setup (GC'd), right after pass 1, after GC; then after pass 2 over other keys, after GC. */
  before: number;
  after1: number;
  afterGc1: number;
  after2: number;
  afterGc2: number;
  /** Wall time of pass 1, ms. */
  ms: number;
}

declare const gc: (() => void) | undefined;

const mb = () => process.memoryUsage().heapUsed / 1_048_576;
function collect(): number {
  // Several rounds: weak maps and finalizers can need more than one.
  for (let i = 0; i < 3; i++) gc?.();
  return mb();
}

/**
 * Runs `take` for `requests` requests cycling over `keys` keys, twice (pass 2 over other keys, after pass 1's buckets
 * refilled). The baseline is taken after a warm-up on yet other keys (so code and caches are in place and the key
 * strings of both passes already exist), once those warm-up buckets have refilled too.
 */
async function heapCase(what: string, requests: number, keyCount: number, take: (key: string) => Promise<unknown>): Promise<HeapRow> {
  const passKeys = (pass: string) => Array.from({ length: keyCount }, (_, i) => `${pass}:user:${i}`);
  const warm = passKeys('w');
  const keys1 = passKeys('p1');
  let keys2 = passKeys('p2');
  for (let i = 0; i < Math.min(requests, 50_000); i++) await take(warm[i % keyCount]!);
  await sleep(REFILL_MS);
  const before = collect();
  const t0 = performance.now();
  for (let i = 0; i < requests; i++) await take(keys1[i % keyCount]!);
  const ms = performance.now() - t0;
  const after1 = mb();
  const afterGc1 = collect();
  await sleep(REFILL_MS);
  for (let i = 0; i < requests; i++) await take(keys2[i % keyCount]!);
  const after2 = mb();
  const afterGc2 = collect();
  // Read the key arrays after the last measurement, so all three stay alive (and counted) in every figure.
  const held = warm.length + keys1.length + keys2.length;
  if (held !== 3 * keyCount) throw new Error('key arrays changed');
  keys2 = [];
  return { what, requests, keys: keyCount, before, after1, afterGc1, after2, afterGc2, ms };
}

/** Longer than a bucket of capacity 10 at 10/s needs to fill up again. */
const REFILL_MS = 1_200;

/** Which in-memory limiter a heap case drives; each case runs in a fresh process so "before" is clean. */
export type HeapSubject = 'bucket' | 'express' | 'koa';

export async function runHeap(job: { subject: HeapSubject; requests: number; keys: number }): Promise<HeapRow> {
  if (typeof gc !== 'function') throw new Error('run with --expose-gc');
  // Capacity 10, 10/s: each key sees requests/keys takes (5 for 1M over 200k), all allowed, and is full again within 1 s.
  switch (job.subject) {
    case 'bucket': {
      const bucket = new TokenBucket({ capacity: 10, rate: '10/s' });
      return heapCase('hasp TokenBucket (in-memory)', job.requests, job.keys, (k) => bucket.take(k));
    }
    case 'express':
      return heapCase('@hasp/express rateLimit (in-memory)', job.requests, job.keys, expressDriver());
    case 'koa':
      return heapCase('@hasp/koa rateLimit (in-memory)', job.requests, job.keys, koaDriver());
  }
}

/** A pooled response is reused: drop the previous request's fields, which the limiter would otherwise append to. */
function clearHeaders(res: http.ServerResponse): void {
  for (const name of res.getHeaderNames()) res.removeHeader(name);
}

/** Calls the Express middleware directly with a small pool of real request/response objects (no sockets). */
function expressDriver(): (key: string) => Promise<unknown> {
  const app = express();
  const mw = haspExpress.rateLimit({ capacity: 10, rate: '10/s', key: (req) => req.headers['x-key'] as string });
  const pool = Array.from({ length: 16 }, () => {
    const req = new http.IncomingMessage(new net.Socket());
    req.method = 'GET';
    req.url = '/';
    const res = new http.ServerResponse(req);
    Object.setPrototypeOf(req, app.request);
    Object.setPrototypeOf(res, app.response);
    Object.assign(req, { app, res });
    Object.assign(res, { app, req });
    return { req: req as unknown as express.Request, res: res as unknown as express.Response };
  });
  let i = 0;
  return (key) => {
    const { req, res } = pool[i++ % pool.length]!;
    req.headers['x-key'] = key;
    clearHeaders(res);
    return new Promise<void>((resolve, reject) => {
      void mw(req, res, (err?: unknown) => (err ? reject(err instanceof Error ? err : new Error(String(err))) : resolve()));
    });
  };
}

/** Calls the Koa middleware directly with contexts made by the app from real request/response objects. */
function koaDriver(): (key: string) => Promise<unknown> {
  const app = new Koa();
  const mw = haspKoa.rateLimit({ capacity: 10, rate: '10/s', key: (ctx) => ctx.headers['x-key'] as string });
  const pool = Array.from({ length: 16 }, () => {
    const req = new http.IncomingMessage(new net.Socket());
    req.method = 'GET';
    req.url = '/';
    const res = new http.ServerResponse(req);
    return { req, res };
  });
  let i = 0;
  return async (key) => {
    const { req, res } = pool[i++ % pool.length]!;
    req.headers['x-key'] = key;
    clearHeaders(res);
    const ctx = app.createContext(req, res);
    await mw(ctx, async () => undefined);
  };
}
