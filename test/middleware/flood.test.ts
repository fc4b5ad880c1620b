// rateLimit under a flood of one key, for Express 4, Express 5, Koa 2 and Koa 3 on a real Redis: denials of a key known
// to be empty are answered from memory (few Redis calls), with exact headers, and never let more through than the
// bucket allows, while every token that comes back is still handed out.
import type { Redis } from 'ioredis';
import { TokenBucket } from '@hasp/core';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { startRedis, stopAll, type RedisNode } from '../harness/redis.js';
import { within } from '../core/helpers.js';
import { trackUnhandled } from '../redlock/support.js';
import { FRAMEWORKS, framework, get, type Framework, type Response, type RunningApp } from './apps.js';

let node: RedisNode;
let redis: Redis;
let admin: Redis;
const fileUnhandled = trackUnhandled();

beforeAll(async () => {
  node = await startRedis();
  redis = node.client();
  admin = node.client();
});

afterAll(async () => {
  fileUnhandled.stop();
  await stopAll();
  expect(fileUnhandled.reasons).toEqual([]);
});

let policySeq = 0;
function freshPolicy(tag: string): string {
  return `${tag}-${process.pid}-${++policySeq}`;
}

/** Script calls (EVALSHA + EVAL) the server has run since its stats were last reset. */
async function scriptCalls(): Promise<number> {
  const info = await admin.info('commandstats');
  let calls = 0;
  for (const m of info.matchAll(/^cmdstat_(?:evalsha|eval):calls=(\d+),/gm)) calls += Number(m[1]);
  return calls;
}

async function serverMicros(): Promise<number> {
  const [s, us] = await admin.time();
  return Number(s) * 1_000_000 + Number(us);
}

describe.each(FRAMEWORKS)('rateLimit flooded on %s', (name) => {
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

  it('answers an emptied key without Redis, with the same headers Redis would give', async () => {
    const policy = freshPolicy('empty');
    const app = await start({ routes: { '/x': { use: [fw.rateLimit({ capacity: 3, rate: '3/min', redis, policy, key: 'k' })] } } });
    for (let i = 0; i < 3; i++) expect((await get(`${app.url}/x`)).status).toBe(200);
    await admin.config('RESETSTAT');
    const denied: Response[] = [];
    for (let batch = 0; batch < 3; batch++) {
      denied.push(...(await within(Promise.all(Array.from({ length: 20 }, () => get(`${app.url}/x`))), 10_000, '20 concurrent requests')));
    }
    expect(await scriptCalls()).toBe(0);
    // What Redis says now (a peek consumes nothing): one token every 20 s, the next one just under 20 s away.
    const peek = await new TokenBucket({ capacity: 3, rate: '3/min', redis: admin, prefix: `hasp:tb:${policy}:` }).peek('k');
    expect(peek.allowed).toBe(false);
    const seconds = Math.ceil(peek.retryAfter / 1_000);
    expect(seconds).toBe(20);
    for (const r of denied) {
      expect(r.status).toBe(429);
      expect(r.body.code).toBe('RATE_LIMITED');
      expect(r.headers['ratelimit-policy']).toBe(`"${policy}";q=3;w=60`);
      expect(r.headers.ratelimit).toBe(`"${policy}";r=0;t=${seconds}`);
      expect(r.headers['retry-after']).toBe(String(seconds));
    }
    expect(app.errors).toHaveLength(60);
    for (const e of app.errors) expect(e).toMatchObject({ status: 429, expose: true, code: 'RATE_LIMITED', headers: { 'Retry-After': String(seconds) } });
  });

  it('lets through no more than capacity + rate × elapsed under a flood, takes every token that comes back, and asks Redis rarely', async () => {
    const capacity = 2;
    const rate = 20;
    const policy = freshPolicy('flood');
    const app = await start({ routes: { '/x': { use: [fw.rateLimit({ capacity, rate, redis, policy, key: 'k' })] } } });
    await admin.config('RESETSTAT');
    const runMs = 1_200;
    let admitted = 0;
    let requests = 0;
    let other = 0;
    let firstDone!: () => void;
    const first = new Promise<void>((resolve) => (firstDone = resolve));
    const t0 = await serverMicros();
    const deadline = performance.now() + runMs;
    const clients = Array.from({ length: 8 }, async () => {
      for (let i = 0; i < 100_000 && performance.now() < deadline; i++) {
        const r = await get(`${app.url}/x`);
        requests++;
        if (r.status === 200) admitted++;
        else if (r.status !== 429) other++;
        firstDone();
      }
    });
    await first;
    const innerStart = await serverMicros();
    await new Promise((resolve) => setTimeout(resolve, runMs - 300));
    const innerEnd = await serverMicros();
    await within(Promise.all(clients), 10_000, 'the flooding clients to stop');
    const t1 = await serverMicros();
    const calls = await scriptCalls();

    expect(other).toBe(0);
    expect(admitted).toBeLessThanOrEqual(capacity + (rate * (t1 - t0)) / 1e6);
    expect(admitted).toBeGreaterThanOrEqual(Math.floor((rate * (innerEnd - innerStart)) / 1e6) - 1);
    // Without the memory, one script call per request; with it, a few per token that comes back.
    expect(requests).toBeGreaterThan(admitted * 3);
    expect(calls).toBeLessThan(requests / 2);
    expect(calls).toBeLessThanOrEqual(admitted * 12);
  });
});
