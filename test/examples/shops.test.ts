// Smoke tests of examples/express-shop and examples/koa-shop: each runs as a child process on a free port, in memory,
// on one private Redis, and on three Redlock nodes; the routes answer 200 -> 429 and 200 + 423 as the README says.
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { send } from '../../examples/snippets/src/check.js';
import { until } from '../core/helpers.js';
import { startRedis, startRedisNodes, stopAll, type RedisNode } from '../harness/redis.js';
import { ROOT, startShop, type ShopProcess } from './shop-process.js';

const SHOPS = ['express-shop', 'koa-shop'] as const;
// Long enough that five requests sent together all arrive while the first one is still paying, even on a loaded CI.
const PAYMENT_MS = '1500';

interface Reply {
  status: number;
  headers: Headers;
  body: Record<string, unknown>;
}

/** The snippets' `send`, for the shops, which answer every request with JSON: a body that is not JSON fails the test. */
async function call(method: 'GET' | 'POST', url: string, body?: unknown): Promise<Reply> {
  const reply = await send(method, url, body);
  if (typeof reply.body === 'string') {
    throw new Error(`${method} ${url}: ${reply.status} with a body that is not JSON: ${reply.body.slice(0, 200)}`);
  }
  return { ...reply, body: reply.body };
}

const unique = (): string => randomBytes(4).toString('hex');
const phone = (): string => `+1555${Math.floor(Math.random() * 1e7).toString().padStart(7, '0')}`;

/** The `t` of one policy in a `RateLimit` field such as `"sms-ip";r=6;t=60, "sms-phone";r=0;t=200`. */
function nextToken(field: string | null, policy: string): number {
  const m = new RegExp(`"${policy}";r=(\\d+);t=(\\d+)`).exec(field ?? '');
  if (!m) throw new Error(`no "${policy}" member in RateLimit: ${field}`);
  return Number(m[2]);
}

/** Waits for GET /health to say 200 (with Redis: connected), as a load balancer's readiness check would. */
async function checkHealth(shop: ShopProcess, store: string): Promise<void> {
  let health = await call('GET', `${shop.url}/health`);
  await until(async () => (health = await call('GET', `${shop.url}/health`)).status === 200, 10_000, `${shop.name} to be healthy`, 50);
  expect(health.body).toMatchObject({ ok: true, store });
  // The banner tells a newcomer what to try.
  expect(shop.output()).toContain(`curl -s ${shop.url}/orders/42`);
}

/** 3 SMS per phone number (the 4th is a 429 with Retry-After >= t, and costs the per-IP limit nothing), then the per-IP limit of 10. */
async function checkSms(shop: ShopProcess): Promise<void> {
  const to = phone();
  for (let i = 0; i < 3; i++) {
    const ok = await call('POST', `${shop.url}/sms/send`, { phone: to });
    expect(ok.status, `SMS ${i + 1}`).toBe(200);
    expect(ok.headers.get('ratelimit-policy')).toBe('"sms-ip";q=10;w=600, "sms-phone";q=3;w=600');
    expect(ok.headers.get('ratelimit')).toMatch(new RegExp(`"sms-ip";r=${9 - i};t=\\d+, "sms-phone";r=${2 - i};t=\\d+`));
  }
  const denied = await call('POST', `${shop.url}/sms/send`, { phone: to });
  expect(denied.status).toBe(429);
  expect(denied.body.error).toBe('RATE_LIMITED');
  const t = nextToken(denied.headers.get('ratelimit'), 'sms-phone');
  expect(t).toBeGreaterThan(0);
  expect(Number(denied.headers.get('retry-after'))).toBeGreaterThanOrEqual(t);
  // The per-IP bucket (10) kept a token for each of the 3 SMS sent, none for the one refused (given back): 7 more numbers
  // pass, the 11th SMS is refused.
  for (let i = 0; i < 7; i++) expect((await call('POST', `${shop.url}/sms/send`, { phone: phone() })).status, `other number ${i}`).toBe(200);
  const perIp = await call('POST', `${shop.url}/sms/send`, { phone: phone() });
  expect(perIp.status).toBe(429);
  expect(perIp.headers.get('ratelimit')).toMatch(/"sms-ip";r=0;t=[1-9]/);
  expect((await call('POST', `${shop.url}/sms/send`, {})).status).toBe(400);
}

/** 5 attempts per username + IP; a right password refills them; the 6th wrong one in a row is a 429. */
async function checkLogin(shop: ShopProcess): Promise<void> {
  const wrong = { username: 'alice', password: 'guess' };
  for (let i = 0; i < 4; i++) expect((await call('POST', `${shop.url}/login`, wrong)).status).toBe(401);
  expect((await call('POST', `${shop.url}/login`, { username: 'alice', password: 'wonderland' })).status).toBe(200);
  for (let i = 0; i < 5; i++) {
    const r = await call('POST', `${shop.url}/login`, wrong);
    expect(r.status, `wrong password ${i + 1} after the refill`).toBe(401);
    expect(r.body.attemptsLeft).toBe(4 - i);
  }
  const limited = await call('POST', `${shop.url}/login`, { username: 'alice', password: 'wonderland' });
  expect(limited.status).toBe(429);
  expect(Number(limited.headers.get('retry-after'))).toBeGreaterThan(0);
  // Another username from the same IP has its own bucket.
  expect((await call('POST', `${shop.url}/login`, { username: `bob-${unique()}`, password: 'x' })).status).toBe(401);
}

/**
 * Five purchases of one order sent at once, spread over `shops`: exactly one 200, four 423 (LOCK_BUSY), and the order
 * shows one purchase; a retry afterwards answers "already-purchased" without buying again.
 * `redlock`: concurrent acquires from two processes can split Redlock's vote so that nobody wins (every request
 * gets 423, as Redlock prescribes, and the client retries), and with a node down a loser may get 503 instead of 423.
 * Never more than one purchase, and the retry buys it if nobody did.
 */
async function checkPurchase(shops: ShopProcess[], redlock = false): Promise<void> {
  const id = `o-${unique()}`;
  const replies = await Promise.all(Array.from({ length: 5 }, (_, i) => call('POST', `${shops[i % shops.length]!.url}/orders/${id}/purchase`)));
  const statuses = replies.map((r) => r.status).sort();
  const winners = statuses.filter((s) => s === 200).length;
  if (redlock) {
    expect(winners, String(statuses)).toBeLessThanOrEqual(1);
    for (const s of statuses) expect([200, 423, 503], String(statuses)).toContain(s);
  } else {
    expect(statuses).toEqual([200, 423, 423, 423, 423]);
  }
  for (const r of replies) {
    if (r.status === 200) expect(r.body).toMatchObject({ order: id, status: 'purchased', purchases: 1 });
    if (r.status === 423) {
      expect(r.body.error).toBe('LOCK_BUSY');
      const retryAfter = r.headers.get('retry-after');
      if (retryAfter !== null) expect(Number(retryAfter)).toBeGreaterThan(0);
    }
  }
  for (const shop of shops) expect((await call('GET', `${shop.url}/orders/${id}`)).body).toMatchObject({ id, purchases: winners });
  const retry = await call('POST', `${shops[0]!.url}/orders/${id}/purchase`);
  expect(retry.status).toBe(200);
  expect(retry.body).toMatchObject({ status: winners === 1 ? 'already-purchased' : 'purchased', purchases: 1 });
  for (const shop of shops) expect((await call('GET', `${shop.url}/orders/${id}`)).body).toMatchObject({ purchases: 1 });
}

/** Stops every shop by PID and checks that each exited by itself (code 0: server and Redis connections closed). */
async function stopShops(shops: ShopProcess[]): Promise<void> {
  const codes = await Promise.all(shops.map((s) => s.stop()));
  codes.forEach((code, i) => expect(code, `exit code of ${shops[i]!.name}:\n${shops[i]!.output()}`).toBe(0));
}

afterAll(stopAll);

describe('pnpm start', () => {
  it('runs express-shop, which builds the packages it imports before starting (a fresh clone has no dist/)', () => {
    const read = (file: string) => JSON.parse(fs.readFileSync(path.join(ROOT, file), 'utf8')) as { name: string; scripts: Record<string, string> };
    const root = read('package.json');
    const shop = read('examples/express-shop/package.json');
    expect(root.scripts.start).toBe(`pnpm --filter ${shop.name} start`);
    expect(shop.scripts.prestart).toBe(`pnpm --filter "${shop.name}^..." run build`);
    expect(shop.scripts.start).toBe('tsx src/main.ts'); // what startShop() runs, minus the build
    const koa = read('examples/koa-shop/package.json');
    expect(koa.scripts.prestart).toBe(`pnpm --filter "${koa.name}^..." run build`);
    expect(koa.scripts.start).toBe('tsx src/main.ts');
  });
});

describe('examples in memory (no Redis)', () => {
  it.each(SHOPS)('%s: limits, locks and a clean exit', async (name) => {
    const shop = await startShop(name, { PAYMENT_MS });
    try {
      await checkHealth(shop, 'memory');
      await Promise.all([checkSms(shop), checkLogin(shop), checkPurchase([shop])]);
    } finally {
      await stopShops([shop]);
    }
  });
});

describe('examples stopping', () => {
  it.each(SHOPS)('%s: SIGTERM during a purchase on a keep-alive connection answers it, then exits 0 at once', async (name) => {
    const shop = await startShop(name, { PAYMENT_MS: '600' });
    const agent = new http.Agent({ keepAlive: true });
    try {
      const purchase = new Promise<number>((resolve, reject) => {
        const req = http.request(`${shop.url}/orders/k1/purchase`, { method: 'POST', agent }, (res) => {
          res.resume();
          res.on('end', () => resolve(res.statusCode ?? 0));
        });
        req.on('error', reject);
        req.end();
      });
      // (The purchase is on its way; nothing tells this process when the shop has read it.)
      await new Promise((resolve) => setTimeout(resolve, 200));
      const stopped = performance.now();
      const code = shop.stop();
      expect(await purchase).toBe(200);
      // Not after the keep-alive timeout (5 s), which its stop deadline used to beat with exit code 1.
      expect(await code).toBe(0);
      expect(performance.now() - stopped).toBeLessThan(4_000);
    } finally {
      agent.destroy();
    }
  });
});

describe('examples on one Redis (REDIS_URL)', () => {
  let redis: RedisNode;
  beforeAll(async () => {
    redis = await startRedis();
  });

  it('express-shop and koa-shop share limits and locks through Redis', async () => {
    const shops = await Promise.all(SHOPS.map((name) => startShop(name, { PAYMENT_MS, REDIS_URL: redis.url })));
    try {
      for (const shop of shops) {
        await checkHealth(shop, 'redis');
        await redis.flush(); // the two shops share every bucket: start each from full ones
        await Promise.all([checkSms(shop), checkLogin(shop), checkPurchase([shop])]);
      }
      // One order bought through both apps at once: still exactly one purchase.
      await checkPurchase(shops);
      // The per-phone budget is shared too: three SMS through one app leave none for the other.
      const to = phone();
      await redis.flush();
      // Each app still refuses the per-IP bucket it saw emptied above from memory, for up to DENY_CACHE_MS (1 s) after
      // a reset made behind its back.
      await new Promise((resolve) => setTimeout(resolve, 1_000));
      for (let i = 0; i < 3; i++) expect((await call('POST', `${shops[i % 2]!.url}/sms/send`, { phone: to })).status).toBe(200);
      expect((await call('POST', `${shops[1]!.url}/sms/send`, { phone: to })).status).toBe(429);
    } finally {
      await stopShops(shops);
    }
  });
});

describe('examples on Redlock (REDIS_NODES, 3 nodes)', () => {
  let nodes: RedisNode[];
  beforeAll(async () => {
    nodes = await startRedisNodes(3);
  });

  it('purchases stay single across both apps while one of three nodes is down', async () => {
    const REDIS_NODES = nodes.map((n) => n.url).join(',');
    const shops = await Promise.all(SHOPS.map((name) => startShop(name, { PAYMENT_MS, REDIS_NODES })));
    try {
      for (const shop of shops) await checkHealth(shop, 'redlock');
      await checkPurchase(shops, true);
      // A minority down: Redlock still has its quorum (limits and orders live on the first node, which stays up).
      await nodes[2]!.kill();
      await checkPurchase(shops, true);
    } finally {
      await stopShops(shops);
    }
  });
});
