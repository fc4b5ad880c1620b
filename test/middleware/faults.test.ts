// rateLimit() and withLock() over real HTTP while their Redis is killed or frozen, for Express 4, Express 5, Koa 2 and
// Koa 3: each onStoreError policy, 503 LOCK_UNAVAILABLE without running the handler, every request answered within a
// bound (ioredis's offline queue and retry budget must not hold requests), and recovery without a restart.
import { TokenBucket } from '@hasp/core';
import { giveBackTakes, RateLimiter, type StoreStateEvent } from '@hasp/core/http';
import type { Redis } from 'ioredis';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { startRedis, stopAll, type RedisNode } from '../harness/redis.js';
import { bucketKey, until } from '../core/helpers.js';
import { notReady, ready, trackUnhandled } from '../redlock/support.js';
import { FRAMEWORKS, framework, get, type Framework, type Response, type RunningApp } from './apps.js';

/**
 * The documented bound is the stores' 2 s timeout; the slack is for a loaded machine. ioredis on its own would hold a
 * request for its whole retry budget (20 reconnect attempts, over 10 s) or, with `maxRetriesPerRequest: null`, forever.
 */
const BOUND_MS = 4_000;

// A full collection on demand, without starting the test process with --expose-gc.
setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;
// Before any test fakes them.
const realSetTimeout = setTimeout;
const DAY_MS = 86_400_000;

/**
 * Sends requests (`poke`, every 50 ms) until the limiter's hook has heard its outage end (`heard` holds 'down' and
 * 'up'): with no reconnect, only a probe started by a request can bring it back.
 */
function heardBack(heard: readonly StoreStateEvent[], poke: () => Promise<unknown>, what: string): Promise<void> {
  return until(
    async () => {
      await poke();
      return heard.length === 2;
    },
    5_000,
    what,
    50,
  );
}

let node: RedisNode;
/** An app client on ioredis's default options (offline queue on, 20 retries per request). */
let redis: Redis;
/** An app client that would retry forever (`maxRetriesPerRequest: null`, as BullMQ wants it). */
let patient: Redis;
const unhandled = trackUnhandled();

beforeAll(async () => {
  node = await startRedis();
  redis = node.client();
  patient = node.client({ maxRetriesPerRequest: null });
  await Promise.all([ready(redis), ready(patient)]);
});

afterAll(async () => {
  unhandled.stop();
  await stopAll();
  expect(unhandled.reasons).toEqual([]);
});

describe.each(FRAMEWORKS)('Redis failures on %s', (name) => {
  let fw: Framework;
  let app: RunningApp | undefined;
  let runs = 0;
  const tag = `${name}-${process.pid}`;

  beforeAll(async () => {
    fw = await framework(name);
  });

  afterEach(async () => {
    // A failed test must not leave the next one a frozen or dead Redis.
    try {
      node.resume();
    } catch {
      // not running: restarted below
    }
    if (redis.status !== 'ready' || patient.status !== 'ready') {
      await node.restart();
      await Promise.all([ready(redis), ready(patient)]);
    }
    await app?.close();
    app = undefined;
  });

  async function startApp(redis: Redis): Promise<RunningApp> {
    runs = 0;
    const limit = (policy: string, onStoreError?: string) =>
      fw.rateLimit({ capacity: 2, rate: '1/h', redis, policy: `${tag}-${policy}`, key: 'k', onStoreError });
    app = await fw.start({
      routes: {
        '/memory': { use: [limit(`memory-${Math.random()}`)] },
        '/open': { use: [limit(`open-${Math.random()}`, 'open')] },
        '/closed': { use: [limit(`closed-${Math.random()}`, 'closed')] },
        '/lock': {
          use: [fw.withLock(() => `${tag}-order`, { redis })],
          handle: () => {
            runs++;
            return undefined;
          },
        },
        // Waiting for a busy lock must not turn a dead Redis into a long wait either.
        '/lockwait': {
          use: [fw.withLock(() => `${tag}-order-wait`, { redis, wait: 10_000 })],
          handle: () => {
            runs++;
            return undefined;
          },
        },
      },
    });
    return app;
  }

  /** Sends a request and checks it was answered within the bound. */
  async function bounded(path: string): Promise<Response> {
    const r = await get(`${app!.url}${path}`);
    expect(r.ms, `${path} answered within ${BOUND_MS} ms`).toBeLessThan(BOUND_MS);
    return r;
  }

  it.each([
    ['default options', () => redis],
    ['maxRetriesPerRequest: null', () => patient],
  ])('applies each onStoreError policy and withLock answers 503 while Redis is dead, then recovers (%s)', async (_how, client) => {
    const redis = client();
    await startApp(redis);
    for (const path of ['/memory', '/open', '/closed', '/lock']) expect((await bounded(path)).status, path).toBe(200);
    expect(runs).toBe(1);

    // Requests already on their way when Redis dies are answered within the bound too.
    const inflight = Promise.all(['/open', '/closed', '/lock'].map((path) => bounded(path)));
    await node.kill();
    await notReady(redis);
    for (const r of await inflight) expect([200, 429, 503]).toContain(r.status);
    const before = runs;

    // 'memory': a per-process bucket of the same size stands in (full: it has not seen the request Redis took).
    const memory = [await bounded('/memory'), await bounded('/memory'), await bounded('/memory')];
    expect(memory.map((r) => r.status)).toEqual([200, 200, 429]);
    expect(memory[0]!.headers.ratelimit).toMatch(/;r=1;t=\d+$/);
    // 'open': requests go through, unlimited and without fields.
    const open = [await bounded('/open'), await bounded('/open'), await bounded('/open')];
    expect(open.map((r) => r.status)).toEqual([200, 200, 200]);
    expect(open[0]!.headers.ratelimit).toBeUndefined();
    // 'closed': 503 with Retry-After.
    const closed = await bounded('/closed');
    expect(closed.status).toBe(503);
    expect(closed.body.code).toBe('RATE_LIMIT_UNAVAILABLE');
    expect(Number(closed.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    // withLock: 503 and the handler never runs without the lock.
    for (const path of ['/lock', '/lockwait']) {
      const lock = await bounded(path);
      expect(lock.status, path).toBe(503);
      expect(lock.body.code, path).toBe('LOCK_UNAVAILABLE');
    }
    expect(runs).toBe(before);

    await node.restart();
    await Promise.all([ready(redis), ready(patient)]);

    // Back on Redis without restarting the app: the fresh server's buckets are full, and they are Redis's again.
    const back = await bounded('/closed');
    expect(back.status).toBe(200);
    // (r=0 when the request cut off by the kill was resent to the new server by ioredis and took its token there.)
    expect(back.headers.ratelimit).toMatch(/;r=[01];t=\d+$/);
    expect((await bounded('/memory')).status).toBe(200);
    const memoryKeys = await redis.keys(`hasp:tb:${tag}-memory-*`);
    expect(memoryKeys).toHaveLength(1);
    const prefix = memoryKeys[0]!.slice(0, memoryKeys[0]!.indexOf('{'));
    expect((await new TokenBucket({ capacity: 2, rate: '1/h', redis, prefix }).peek('k')).remaining).toBe(0);
    // An acquire cut off by the kill may be resent to the new server and hold the lock until its late answer is undone.
    await until(async () => (await bounded('/lock')).status === 200, 5_000, 'withLock to lock again', 50);
    expect(runs).toBe(before + 1);
  });

  it('answers within the bound while Redis is frozen, stops asking it, and recovers once it answers', async () => {
    await startApp(redis);
    for (const path of ['/memory', '/closed', '/lock']) expect((await bounded(path)).status, path).toBe(200);
    node.pause();
    // The connection stays up: only the 2 s timeout can notice. All at once, so the file stays fast.
    const [memory, closed, lock, lockWait] = await Promise.all(['/memory', '/closed', '/lock', '/lockwait'].map((p) => bounded(p)));
    expect(memory!.status).toBe(200);
    expect(closed!.status).toBe(503);
    expect(closed!.body.code).toBe('RATE_LIMIT_UNAVAILABLE');
    for (const r of [lock!, lockWait!]) {
      expect(r.status).toBe(503);
      expect(r.body.code).toBe('LOCK_UNAVAILABLE');
    }
    expect(runs).toBe(1);
    // The limiter's circuit is open: it no longer waits for the frozen Redis.
    const fast = await bounded('/closed');
    expect(fast.status).toBe(503);
    expect(fast.ms).toBeLessThan(500);

    node.resume();
    // (The request that timed out still reaches Redis once it thaws and takes its token: 200 or 429 means Redis decided.)
    await until(async () => (await bounded('/closed')).status !== 503, 5_000, 'the limiter to use Redis again', 100);
    await until(async () => (await bounded('/lock')).status === 200, 5_000, 'withLock to lock again', 100);
    expect(runs).toBe(2);
  });
});

describe('rate limiters sharing one client while its Redis is down', () => {
  it('wait for the client to be ready again with one listener, however many there are, then all go back to Redis', async () => {
    const own = await startRedis();
    const client = own.client();
    await ready(client);
    const warnings: Error[] = [];
    const onWarning = (warning: Error): void => void warnings.push(warning);
    process.on('warning', onWarning);
    try {
      // More limiters than Node's default listener limit, as an app with a limit per route has.
      const limiters = Array.from(
        { length: 12 },
        (_, i) => new RateLimiter({ capacity: 2, rate: '1/h', redis: client, policy: `route-${i}`, key: 'k', onStoreError: 'open' }, () => 'k'),
      );
      const before = client.listenerCount('ready');
      await own.kill();
      await notReady(client);
      // 'open': not limited while Redis is down.
      expect(await Promise.all(limiters.map((l) => l.check({})))).toEqual(limiters.map(() => undefined));
      expect(client.listenerCount('ready')).toBe(before + 1);
      await own.restart();
      await ready(client);
      // Back on Redis at once (no probe needed): every limiter takes from its bucket there.
      const decisions = await Promise.all(limiters.map((l) => l.check({})));
      expect(decisions.map((d) => d?.remaining)).toEqual(limiters.map(() => 1));
      expect(await client.dbsize()).toBe(limiters.length);
      expect(client.listenerCount('ready')).toBe(before);
      expect(warnings.filter((w) => w.name === 'MaxListenersExceededWarning')).toEqual([]);
    } finally {
      process.off('warning', onWarning);
    }
  });
});

describe('a bucket key that holds something else', () => {
  it.each(['closed', 'memory'] as const)('fails that key alone (%s): the other keys keep going to Redis, and nobody hears an outage', async (policy) => {
    const prefix = `hasp:tb:key-fault-${policy}:`;
    const bucket = new TokenBucket({ capacity: 2, rate: '2/h', redis, prefix });
    const heard: StoreStateEvent[] = [];
    const limiter = new RateLimiter(
      { bucket, key: (a: { key: string }) => a.key, onStoreError: policy, onStoreState: (e) => void heard.push(e) },
      () => undefined,
    );
    // Someone else's data under the bucket's name.
    await redis.hset(bucketKey(bucket, prefix, 'bad'), 'f', '1');
    const bad = await limiter.check({ key: 'bad' }).then(
      (d) => (d?.allowed ? 'allowed' : 'refused'),
      (e: { status?: number }) => e.status,
    );
    expect(bad).toBe(policy === 'closed' ? 503 : 'allowed');
    // The others are still decided by Redis: two takes of two, then refused, in every limiter on that Redis.
    const decided = [];
    for (let i = 0; i < 3; i++) decided.push((await limiter.check({ key: 'good' }))?.allowed);
    expect(decided).toEqual([true, true, false]);
    expect((await bucket.peek('good')).allowed).toBe(false);
    expect(heard).toEqual([]);
    expect(await redis.hgetall(bucketKey(bucket, prefix, 'bad'))).toEqual({ f: '1' });
  });
});

describe('giving back the takes of a refused request while Redis is down', () => {
  it('gives back what the memory fallback took, so the refusal costs nothing there either', async () => {
    const own = await startRedis();
    const client = own.client();
    await ready(client);
    const perIp = new RateLimiter({ capacity: 2, rate: '1/h', redis: client, policy: 'ip', key: 'k', onStoreError: 'memory' }, () => 'k');
    const perPhone = new RateLimiter<{ phone: string }>({ capacity: 1, rate: '1/h', policy: 'phone', key: (r) => r.phone }, () => 'k');
    await own.kill();
    await notReady(client);
    /** One request through both limiters, as the adapters run them; the statuses it would get. */
    const request = async (phone: string): Promise<number> => {
      const home = {};
      const first = await perIp.check({ phone }, home);
      if (!first!.allowed) return 429;
      const second = await perPhone.check({ phone }, home);
      if (second!.allowed) return 200;
      await giveBackTakes(home);
      return 429;
    };
    const statuses: number[] = [];
    for (const phone of ['1', '1', '1', '1', '2', '3']) statuses.push(await request(phone));
    // The per-IP budget of 2 (in the fallback bucket) goes to phones 1 and 2; phone 1's refusals cost it nothing.
    expect(statuses).toEqual([200, 429, 429, 429, 200, 429]);
  });
});

describe('onStoreState', () => {
  it('tells each limiter once when its Redis goes down and once when it is back, however many requests meet the outage', async () => {
    const own = await startRedis();
    const client = own.client();
    await ready(client);
    const heard: StoreStateEvent[][] = [[], []];
    const limiter = (i: number, hook?: (e: StoreStateEvent) => void) =>
      new RateLimiter(
        { capacity: 5, rate: '1/h', redis: client, policy: 'state', key: 'k', onStoreState: hook ?? ((e) => void heard[i]!.push(e)) },
        () => 'k',
      );
    // Two limiters on the same bucket (same client and policy) share its circuit; a third one's hook throws.
    const limiters = [
      limiter(0),
      limiter(1),
      limiter(2, () => {
        throw new Error('a broken hook');
      }),
      // An async hook that fails: its rejection must not go unhandled (that ends a process by default).
      limiter(3, async () => {
        await Promise.resolve();
        throw new Error('a broken async hook');
      }),
    ];
    expect((await limiters[0]!.check({}))?.allowed).toBe(true);
    await own.kill();
    await notReady(client);
    // 'memory' (the default): the fallback answers, with or without a throwing hook.
    for (let i = 0; i < 4; i++) for (const l of limiters) expect((await l.check({}))?.allowed).toBe(true);
    for (const events of heard) {
      expect(events.map((e) => e.state)).toEqual(['down']);
      expect((events[0]!.error as { code?: string }).code).toBe('RATE_LIMIT_UNAVAILABLE');
    }
    await own.restart();
    await ready(client);
    for (const l of limiters) expect((await l.check({}))?.allowed).toBe(true);
    for (const events of heard) expect(events.map((e) => e.state)).toEqual(['down', 'up']);
    // (Node reports an unhandled rejection after the microtasks of the turn it happened in.)
    await new Promise((resolve) => setImmediate(resolve));
    expect(unhandled.reasons).toEqual([]);
    client.disconnect();
    await own.stop();
  });

  /** A limiter of capacity 2 on a Redis of its own, keyed by its argument, and what its hook hears. */
  const fallbackLimiter = async (rate: string) => {
    const own = await startRedis();
    const client = own.client();
    await ready(client);
    const heard: string[] = [];
    const limiter = new RateLimiter(
      { capacity: 2, rate, redis: client, policy: 'fallback', onStoreState: (e) => void heard.push(e.state) },
      (ip: string) => ip,
    );
    const guard = (limiter as unknown as { guard: { fallbackBucket?: TokenBucket } }).guard;
    return { own, client, heard, limiter, guard };
  };

  it('drops the memory fallback once Redis is back and its buckets are full again, not before', async () => {
    // A full refill takes 200 ms: the fallback is dropped 1.2 s after Redis is back.
    const { own, client, heard, limiter, guard } = await fallbackLimiter('2/200ms');
    await own.kill();
    await notReady(client);
    for (let i = 0; i < 100; i++) expect((await limiter.check(`10.0.0.${i}`))?.allowed).toBe(true);
    const fallback = guard.fallbackBucket;
    expect(fallback).toBeDefined();
    await own.restart();
    await ready(client);
    expect((await limiter.check('10.0.0.1'))?.allowed).toBe(true);
    expect(heard).toEqual(['down', 'up']);
    // Still there within the refill (a new outage then must not bring back full buckets)...
    expect(guard.fallbackBucket).toBe(fallback);
    // ...and gone after it.
    await until(() => guard.fallbackBucket === undefined, 5_000, 'the fallback to be dropped');
    client.disconnect();
    await own.stop();
  });

  it('drops the memory fallback also when a full refill takes longer than a timer can wait (24.8 days)', async () => {
    // A full refill takes 30 days: past the longest timeout Node keeps (2^31 - 1 ms), so it is waited out in steps.
    const { own, client, heard, limiter, guard } = await fallbackLimiter('2/30d');
    expect((await limiter.check('10.0.0.1'))?.allowed).toBe(true);
    own.pause();
    try {
      for (let i = 0; i < 20; i++) expect((await limiter.check(`10.0.1.${i}`))?.allowed).toBe(true);
    } finally {
      own.resume();
    }
    const fallback = guard.fallbackBucket;
    expect(fallback).toBeDefined();
    expect(heard).toEqual(['down']);
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
    try {
      // The connection never dropped: a probe, sent while requests come in, finds Redis answering.
      const deadline = performance.now() + 5_000;
      while (heard.length < 2) {
        if (performance.now() > deadline) throw new Error('timed out waiting for the limiter to hear Redis is back');
        await limiter.check('10.0.0.2');
        await new Promise((resolve) => realSetTimeout(resolve, 50));
      }
      expect(heard).toEqual(['down', 'up']);
      vi.advanceTimersByTime(29 * DAY_MS);
      expect(guard.fallbackBucket).toBe(fallback);
      vi.advanceTimersByTime(DAY_MS + 2_000);
      expect(guard.fallbackBucket).toBeUndefined();
    } finally {
      vi.useRealTimers();
    }
    client.disconnect();
    await own.stop();
  });

  it("keeps no dropped limiter's onStoreState hook on a shared bucket, and tells a hook given to two limiters once", async () => {
    const own = await startRedis();
    const client = own.client();
    await ready(client);
    const bucket = new TokenBucket({ capacity: 5, rate: '1/h', redis: client, prefix: 'shared-hooks:' });
    const heard: string[] = [];
    const sharedHook = (e: StoreStateEvent): void => void heard.push(e.state);
    const kept = [new RateLimiter({ bucket, onStoreState: sharedHook }, () => 'k'), new RateLimiter({ bucket, onStoreState: sharedHook }, () => 'k')];
    // Limiters made per tenant and dropped, each with a hook of its own.
    let droppedCalls = 0;
    for (let i = 0; i < 1_000; i++) new RateLimiter({ bucket, onStoreState: () => void droppedCalls++ }, () => 'k');
    // (A WeakRef's target stays alive until the turn that made it ends.)
    await new Promise((resolve) => setImmediate(resolve));
    gc();
    // One more limiter sweeps out the holders of the dropped ones.
    for (let i = 0; i < 100; i++) new RateLimiter({ bucket, onStoreState: () => void droppedCalls++ }, () => 'k');
    await new Promise((resolve) => setImmediate(resolve));
    gc();
    const listeners = (kept[0] as unknown as { guard: { listeners: Set<unknown> } }).guard.listeners;
    expect(listeners.size).toBeLessThan(200);
    await own.kill();
    await notReady(client);
    await expect(kept[0]!.check({})).resolves.toBeDefined();
    expect(heard).toEqual(['down']);
    await own.restart();
    await ready(client);
    await until(() => heard.length === 2, 5_000, 'the hook to hear Redis is back');
    expect(heard).toEqual(['down', 'up']);
    expect(droppedCalls).toBe(0);
    expect(listeners.size).toBe(2);
    client.disconnect();
    await own.stop();
  });

  it('hears a frozen Redis go down at the timeout and come back when a probe gets an answer', async () => {
    const own = await startRedis();
    const client = own.client();
    await ready(client);
    const heard: StoreStateEvent[] = [];
    const limiter = new RateLimiter(
      { capacity: 5, rate: '1/h', redis: client, policy: 'frozen', key: 'k', onStoreError: 'open', onStoreState: (e) => void heard.push(e) },
      () => 'k',
    );
    expect((await limiter.check({}))?.allowed).toBe(true);
    own.pause();
    try {
      // Unanswered within the bucket's timeout: let through ('open'), and down.
      expect(await limiter.check({})).toBeUndefined();
      expect(heard.map((e) => e.state)).toEqual(['down']);
    } finally {
      own.resume();
    }
    // The connection never dropped, so no 'ready': a probe (sent while requests come in) finds Redis answering.
    await heardBack(heard, () => limiter.check({}), 'the limiter to hear Redis is back');
    expect(heard.map((e) => e.state)).toEqual(['down', 'up']);
    client.disconnect();
    await own.stop();
  });

  it('stays down, heard once, while Redis answers reads but refuses writes (out of memory), and comes back when takes work', async () => {
    const own = await startRedis();
    const client = own.client();
    const admin = own.client();
    await Promise.all([ready(client), ready(admin)]);
    const heard: StoreStateEvent[] = [];
    const limiter = new RateLimiter(
      { capacity: 5, rate: '1/h', redis: client, policy: 'oom', key: (a: { key: string }) => a.key, onStoreError: 'closed', onStoreState: (e) => void heard.push(e) },
      () => undefined,
    );
    // The innermost cause of each 503: Redis's own reply, also for the 503s of an open circuit (no call made).
    const roots: string[] = [];
    const status = (key: string) =>
      limiter.check({ key }).then(
        (d) => (d?.allowed ? 200 : 429),
        (e: { status?: number; cause?: unknown }) => {
          let root: unknown = e;
          while ((root as { cause?: unknown }).cause !== undefined) root = (root as { cause: unknown }).cause;
          roots.push(String((root as Error).message));
          return e.status;
        },
      );
    expect(await status('warm')).toBe(200);
    await admin.config('SET', 'maxmemory-policy', 'noeviction');
    await admin.config('SET', 'maxmemory', '1');
    try {
      // Three probe intervals of requests on fresh keys: every one refused, and the outage heard once. (A probe that only
      // read would find Redis answering, call it up, and the next take would take it down again.)
      const deadline = performance.now() + 3 * 500 + 100;
      for (let i = 0; performance.now() < deadline; i++) {
        expect(await status(`k${i}`)).toBe(503);
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      expect(heard.map((e) => e.state)).toEqual(['down']);
      expect(roots.length).toBeGreaterThan(5);
      // (Redis 6 answers a refused write inside a script as 'ERR Error running script ...: -OOM command not allowed ...'.)
      for (const r of roots) expect(r).toMatch(/\bOOM command not allowed/);
    } finally {
      await admin.config('SET', 'maxmemory', '0');
    }
    await heardBack(heard, () => status('after'), 'the limiter to hear Redis takes again');
    expect(heard.map((e) => e.state)).toEqual(['down', 'up']);
    expect(await status('again')).toBe(200);
    client.disconnect();
    admin.disconnect();
    await own.stop();
  });

  it('comes back when the key that failed last holds something else: its probe meets a key fault, so Redis answers', async () => {
    const own = await startRedis();
    const client = own.client();
    const admin = own.client();
    await Promise.all([ready(client), ready(admin)]);
    const heard: StoreStateEvent[] = [];
    const bucket = new TokenBucket({ capacity: 5, rate: '1/h', redis: client, prefix: 'hasp:tb:probe-fault:', timeout: 300 });
    const limiter = new RateLimiter({ bucket, key: (a: { key: string }) => a.key, onStoreState: (e) => void heard.push(e) }, () => undefined);
    await admin.hset(bucketKey(bucket, 'hasp:tb:probe-fault:', 'bad'), 'f', '1');
    own.pause();
    try {
      // Unanswered, not a key fault: down, and the probes take that key from now on ('memory' answers meanwhile).
      expect((await limiter.check({ key: 'bad' }))?.allowed).toBe(true);
      expect(heard.map((e) => e.state)).toEqual(['down']);
    } finally {
      own.resume();
    }
    // The connection never dropped (no 'ready'): only a probe can bring the limiter back, and its key answers WRONGTYPE.
    await heardBack(heard, () => limiter.check({ key: 'good' }), 'the limiter to hear Redis is back');
    expect(heard.map((e) => e.state)).toEqual(['down', 'up']);
    expect(await admin.exists(bucketKey(bucket, 'hasp:tb:probe-fault:', 'good'))).toBe(1);
    client.disconnect();
    admin.disconnect();
    await own.stop();
  });

  it('probes on the monotonic clock: a wall clock stepped back during an outage delays neither recovery nor Retry-After', async () => {
    const own = await startRedis();
    const client = own.client();
    await ready(client);
    const heard: StoreStateEvent[] = [];
    const bucket = new TokenBucket({ capacity: 5, rate: '1/h', redis: client, timeout: 300 });
    const limiter = new RateLimiter({ bucket, key: 'k', onStoreError: 'closed', onStoreState: (e) => void heard.push(e) }, () => 'k');
    expect((await limiter.check({}))?.allowed).toBe(true);
    own.pause();
    const wall = Date.now.bind(Date);
    try {
      await expect(limiter.check({})).rejects.toMatchObject({ status: 503 });
      // NTP steps the clock back an hour while Redis is out.
      vi.spyOn(Date, 'now').mockImplementation(() => wall() - 3_600_000);
      const refused = (await limiter.check({}).catch((e: unknown) => e)) as { status?: number; headers?: Record<string, string> };
      expect(refused.status).toBe(503);
      expect(refused.headers?.['Retry-After']).toBe('1');
    } finally {
      own.resume();
    }
    try {
      await heardBack(heard, () => limiter.check({}).catch(() => undefined), 'the limiter to hear Redis is back');
      expect((await limiter.check({}))?.allowed).toBe(true);
    } finally {
      vi.restoreAllMocks();
    }
    client.disconnect();
    await own.stop();
  });
});

describe('bucket names of rate limiters', () => {
  it("keeps policies apart whatever they hold: 'p:{x' with key 'victim' and 'p' with key 'x:{victim' share nothing", async () => {
    const base = `names-${process.pid}-${Date.now()}`;
    const limiter = (policy: string) =>
      new RateLimiter({ capacity: 2, rate: '2/h', redis, policy, key: (a: { key: string }) => a.key, onStoreError: 'closed' }, () => undefined);
    // Both made `hasp:tb:<base>:{x:{victim}` while a '{' in a policy went into the prefix as it was.
    const one = limiter(`${base}:{x`);
    const other = limiter(base);
    for (let i = 0; i < 2; i++) expect((await other.check({ key: 'x:{victim' }))?.allowed).toBe(true);
    expect((await other.check({ key: 'x:{victim' }))?.allowed).toBe(false);
    expect((await one.check({ key: 'victim' }))?.allowed).toBe(true);
    expect(await redis.keys(`hasp:tb:${base}*`)).toHaveLength(2);
  });
});
