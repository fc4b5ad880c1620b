// TokenBucket against SPEC "Core: token bucket": decisions, rates, one script call per take, the server's clock,
// expiry, concurrent takers, bad arguments, hostile keys, a dead or frozen Redis, and the bounded in-memory store.
import { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { RateLimitUnavailableError, TokenBucket, type Decision } from '../../packages/core/src/index.js';
import { giveBackTakes, RateLimiter } from '../../packages/core/src/http/rate-limiter.js';
import type { MemoryBucketStore } from '../../packages/core/src/rate-limit/bucket-store.js';
import { EXPIRY_GRID_US } from '../../packages/core/src/rate-limit/bucket.lua.js';
import { subMsClock, wallNow } from '../../packages/core/src/util/clock.js';
import { startProxy } from '../harness/proxy.js';
import { startRedis, stopAll, type RedisNode } from '../harness/redis.js';
import { bucketKey, expectInvalid, rejection, uniquePrefix, until, within } from './helpers.js';

afterAll(async () => {
  await stopAll();
});

/** A hand-moved clock in epoch ms for the in-memory store. */
function manualClock(start = 1_700_000_000_000): { now: () => number; advance: (ms: number) => void } {
  let t = start;
  return { now: () => t, advance: (ms) => void (t += ms) };
}

/** Redis TIME in µs. */
async function serverMicros(redis: Redis): Promise<number> {
  const [s, us] = await redis.time();
  return Number(s) * 1_000_000 + Number(us);
}

/**
 * Checks that the bucket key `name`, holding `tat` (µs), expires at the end of that TAT's second on the server's clock.
 * The script sets the expiry relative to the clock it read when it started (PX), so a millisecond or two that passed
 * while it ran land on top (more on a loaded machine): never earlier, which is what keeps the bucket.
 */
async function expectExpiry(redis: Redis, name: string, tat: number): Promise<void> {
  const end = (Math.floor(tat / EXPIRY_GRID_US) + 1) * (EXPIRY_GRID_US / 1_000);
  // PEXPIRETIME is Redis 7 only: the server's clock read just after PTTL in one transaction gives the expiry, or a
  // moment past it, never before it.
  const [[, pttl], [, time]] = (await redis.multi().pttl(name).time().exec()) as [[null, number], [null, [string, string]]];
  const at = Number(time[0]) * 1_000 + Math.floor(Number(time[1]) / 1_000) + pttl;
  expect(at).toBeGreaterThanOrEqual(end);
  expect(at).toBeLessThanOrEqual(end + 50);
}

/** The in-memory store behind a bucket built without `redis`. */
function memoryStore(bucket: TokenBucket): MemoryBucketStore {
  return (bucket as unknown as { store: MemoryBucketStore }).store;
}

let node: RedisNode;
let admin: Redis;

beforeAll(async () => {
  node = await startRedis();
  admin = node.client();
});

/**
 * Both backends behind one interface. Redis time cannot be moved, so `advance` exists only in memory; the tests that
 * run on both keep the elapsed real time far below one token's interval, so the numbers are exact on Redis too.
 */
interface Backend {
  name: 'memory' | 'redis';
  make(options: { capacity: number; rate: number | string }): TokenBucket;
}

const backends: Backend[] = [
  { name: 'memory', make: (o) => new TokenBucket({ ...o, clock: manualClock().now }) },
  { name: 'redis', make: (o) => new TokenBucket({ ...o, redis: admin, prefix: uniquePrefix('tb') }) },
];

describe.each(backends)('TokenBucket decisions ($name)', (backend) => {
  it('follows the SPEC example: capacity 10 at 2/s leaves 3 after 7 takes, and denies the 11th', async () => {
    const bucket = backend.make({ capacity: 10, rate: '2/s' });
    let d!: Decision;
    for (let i = 1; i <= 7; i++) {
      d = await bucket.take('user');
      expect(d).toMatchObject({ allowed: true, limit: 10, remaining: 10 - i, retryAfter: 0 });
    }
    expect(d.remaining).toBe(3);
    // 7 tokens short at 2/s: full again in 3.5 s (less the little real time spent on Redis).
    expect(d.resetAfter).toBeLessThanOrEqual(3_500);
    expect(d.resetAfter).toBeGreaterThan(3_300);
    for (let i = 8; i <= 10; i++) expect((await bucket.take('user')).allowed).toBe(true);
    const denied = await bucket.take('user');
    expect(denied).toMatchObject({ allowed: false, limit: 10, remaining: 0 });
    // One token comes back every 500 ms.
    expect(denied.retryAfter).toBeLessThanOrEqual(500);
    expect(denied.retryAfter).toBeGreaterThan(300);
    expect(denied.resetAfter).toBeLessThanOrEqual(5_000);
    expect(denied.resetAfter).toBeGreaterThan(4_800);
  });

  it('starts full, and peek consumes nothing (also on an empty bucket)', async () => {
    const bucket = backend.make({ capacity: 4, rate: '1/min' });
    for (let i = 0; i < 5; i++) {
      expect(await bucket.peek('k')).toEqual({ allowed: true, limit: 4, remaining: 3, retryAfter: 0, resetAfter: 60_000 });
    }
    expect(await bucket.peek('k', 4)).toMatchObject({ allowed: true, remaining: 0 });
    expect(await bucket.take('k', 4)).toMatchObject({ allowed: true, remaining: 0, retryAfter: 0 });
    for (let i = 0; i < 3; i++) {
      const p = await bucket.peek('k');
      expect(p).toMatchObject({ allowed: false, remaining: 0 });
      expect(p.retryAfter).toBeGreaterThan(59_000);
      expect(p.retryAfter).toBeLessThanOrEqual(60_000);
    }
    // The bucket was not touched by the peeks: still exactly empty.
    expect(await bucket.take('k')).toMatchObject({ allowed: false, remaining: 0 });
    expect(await bucket.peek('other')).toMatchObject({ allowed: true, remaining: 3 });
  });

  it('reset refills the bucket, also for a key that was never used', async () => {
    const bucket = backend.make({ capacity: 3, rate: '1/h' });
    await bucket.take('k', 3);
    expect((await bucket.peek('k')).allowed).toBe(false);
    await bucket.reset('k');
    expect(await bucket.peek('k', 3)).toEqual({ allowed: true, limit: 3, remaining: 0, retryAfter: 0, resetAfter: 3 * 3_600_000 });
    expect(await bucket.take('k')).toMatchObject({ allowed: true, remaining: 2 });
    await expect(bucket.reset('never-used')).resolves.toBeUndefined();
  });

  it('weighs takes by cost; a denied take consumes nothing; fractional costs add up', async () => {
    const bucket = backend.make({ capacity: 10, rate: '1/min' });
    expect(await bucket.take('w', 7)).toMatchObject({ allowed: true, remaining: 3 });
    const denied = await bucket.take('w', 4);
    expect(denied).toMatchObject({ allowed: false, remaining: 3 });
    // One token short: 60 s.
    expect(denied.retryAfter).toBeGreaterThan(59_000);
    expect(denied.retryAfter).toBeLessThanOrEqual(60_000);
    expect(await bucket.take('w', 3)).toMatchObject({ allowed: true, remaining: 0 });

    expect(await bucket.take('half', 0.5)).toMatchObject({ allowed: true, remaining: 9 });
    expect(await bucket.take('half', 0.5)).toMatchObject({ allowed: true, remaining: 9 });
    expect(await bucket.take('half', 0.5)).toMatchObject({ allowed: true, remaining: 8 });
    expect(await bucket.take('half', 8.5)).toMatchObject({ allowed: true, remaining: 0 });
    expect((await bucket.take('half', 0.5)).allowed).toBe(false);
  });

  it.each([
    [4.1, '1/s'],
    [1.1, '10/s'],
    [0.7, '1000/d'],
    [33.3, '1/d'],
    [2.9, '6/s'],
  ])('grants a take of the whole capacity %d on a full bucket at %s, though capacity × µs per token is not whole', async (capacity, rate) => {
    // 4.1 × 1e6 µs is 4099999.9999999995 in floating point, less than the 4100000 whole µs a take of 4.1 is charged.
    const bucket = backend.make({ capacity, rate });
    expect(await bucket.take('k', capacity)).toMatchObject({ allowed: true, remaining: 0 });
    const again = await bucket.take('k', capacity);
    expect(again.allowed).toBe(false);
    // A denial never says "now": the time to refill the whole capacity, within the ms the test took on Redis.
    expect(again.retryAfter).toBeGreaterThan((capacity * 1_000) / bucket.rate - 500);
  });

  it.each([
    [2, 2],
    ['2/s', 2],
    ['30/min', 0.5],
    ['100/h', 100 / 3_600],
    ['1000/d', 1_000 / 86_400],
    ['5/10s', 0.5],
    ['1/500ms', 2],
    [' 3 / 2 minutes ', 3 / 120],
    ['1.5/Sec', 1.5],
  ])('accepts rate %j as %d tokens per second and refills at that rate', async (rate, perSecond) => {
    const bucket = backend.make({ capacity: 1, rate });
    expect(bucket.rate).toBeCloseTo(perSecond, 12);
    await bucket.take('r');
    const d = await bucket.peek('r');
    // The interval is rounded up to a whole µs, so allow 1 ms above.
    const interval = 1_000 / perSecond;
    expect(d.allowed).toBe(false);
    expect(d.retryAfter).toBeLessThanOrEqual(Math.ceil(interval) + 1);
    expect(d.retryAfter).toBeGreaterThan(interval - 200);
  });
});

describe('TokenBucket in memory, on an injected clock', () => {
  it('refills continuously: tokens come back at the rate, never above capacity', async () => {
    const clock = manualClock();
    const bucket = new TokenBucket({ capacity: 5, rate: '2/s', clock: clock.now });
    expect(await bucket.take('k', 5)).toEqual({ allowed: true, limit: 5, remaining: 0, retryAfter: 0, resetAfter: 2_500 });
    clock.advance(499);
    expect(await bucket.peek('k')).toEqual({ allowed: false, limit: 5, remaining: 0, retryAfter: 1, resetAfter: 2_001 });
    clock.advance(1);
    expect(await bucket.take('k')).toEqual({ allowed: true, limit: 5, remaining: 0, retryAfter: 0, resetAfter: 2_500 });
    clock.advance(1_250);
    // 2.5 tokens back: 2 whole ones left after taking none.
    expect(await bucket.peek('k', 3)).toEqual({ allowed: false, limit: 5, remaining: 2, retryAfter: 250, resetAfter: 1_250 });
    clock.advance(60_000);
    expect(await bucket.peek('k')).toEqual({ allowed: true, limit: 5, remaining: 4, retryAfter: 0, resetAfter: 500 });
    expect(await bucket.take('k', 5)).toMatchObject({ allowed: true, remaining: 0 });
  });

  it('counts a bucket as empty, not locked out, when the clock goes back', async () => {
    const clock = manualClock();
    const bucket = new TokenBucket({ capacity: 10, rate: '1/s', clock: clock.now });
    expect((await bucket.take('k', 10)).allowed).toBe(true);
    // An NTP step back by an hour: the bucket is at worst empty, so a token is 1 s away, not an hour.
    clock.advance(-3_600_000);
    expect(await bucket.peek('k')).toEqual({ allowed: false, limit: 10, remaining: 0, retryAfter: 1_000, resetAfter: 10_000 });
    expect(await bucket.take('k')).toEqual({ allowed: false, limit: 10, remaining: 0, retryAfter: 1_000, resetAfter: 10_000 });
    clock.advance(1_000);
    expect(await bucket.take('k')).toMatchObject({ allowed: true, remaining: 0 });
    clock.advance(60_000);
    expect(await bucket.peek('k')).toMatchObject({ allowed: true, remaining: 9 });
  });

  it('uses Date.now when no clock is given, read at each call (so fake timers apply)', async () => {
    const bucket = new TokenBucket({ capacity: 1, rate: '1/h' });
    expect((await bucket.take('k')).allowed).toBe(true);
    expect((await bucket.take('k')).allowed).toBe(false);
    const real = Date.now();
    // A ms more than the hour: the take was stamped within its ms (the clock counts fractions of one).
    const spy = vi.spyOn(Date, 'now').mockReturnValue(real + 3_600_001);
    try {
      expect((await bucket.take('k')).allowed).toBe(true);
    } finally {
      spy.mockRestore();
    }
  });

  it('stays bounded: buckets that are full again are dropped as other keys are used', async () => {
    const clock = manualClock();
    const bucket = new TokenBucket({ capacity: 3, rate: '1/s', clock: clock.now });
    const store = memoryStore(bucket);
    for (let i = 0; i < 1_000; i++) await bucket.take(`k${i}`, 1 + (i % 3));
    expect(store.size).toBe(1_000);
    // Peeks and denials store nothing.
    for (let i = 0; i < 50; i++) await bucket.peek(`fresh${i}`);
    expect(store.size).toBe(1_000);
    // Not full yet (k*2 buckets took 3 tokens, full after 3 s): nothing may be dropped.
    clock.advance(2_500);
    for (let i = 0; i < 400; i++) await bucket.peek('hot');
    expect(store.size).toBe(Math.floor(1_000 / 3));
    clock.advance(500);
    for (let i = 0; i < 400; i++) await bucket.take('hot');
    // Only 'hot' is left (it is empty now).
    expect(store.size).toBe(1);
    for (let i = 0; i < 30; i++) expect((await bucket.peek(`k${i}`)).remaining).toBe(2);
  });

  it('charges at least a microsecond of refill for a tiny cost, so tiny takes are never free', async () => {
    const clock = manualClock();
    const bucket = new TokenBucket({ capacity: 1, rate: 1_000_000, clock: clock.now });
    let admitted = 0;
    for (let i = 0; i < 100; i++) if ((await bucket.take('k', 0.1)).allowed) admitted++;
    // 1 token at 1 µs per token: a continuous bucket would admit 10 takes of 0.1; whole µs admit 1.
    expect(admitted).toBeGreaterThanOrEqual(1);
    expect(admitted).toBeLessThanOrEqual(10);
  });

  it('drops a full bucket even when only one key is ever used', async () => {
    const clock = manualClock();
    const bucket = new TokenBucket({ capacity: 2, rate: '10/s', clock: clock.now });
    const store = memoryStore(bucket);
    await bucket.take('a');
    expect(store.size).toBe(1);
    clock.advance(100);
    await bucket.peek('b');
    await bucket.peek('b');
    expect(store.size).toBe(0);
  });
});

describe('TokenBucket in memory, on its own clock', () => {
  it('refills within a millisecond: a rate above capacity per ms is reached', async () => {
    // 1 token of burst, 100 per ms: on whole-ms time every take within a ms would see no refill (about 1 per ms).
    const bucket = new TokenBucket({ capacity: 1, rate: 100_000 });
    let allowed = 0;
    const started = performance.now();
    let elapsed = 0;
    // The whole milliseconds the loop ran in: on whole-ms time it could get one take per such ms at most. (Counted
    // rather than taken from the elapsed time, which on a loaded machine includes time the process did not run.)
    const msSeen = new Set<number>();
    for (let i = 0; i < 200_000 && elapsed < 50; i++) {
      if ((await bucket.take('k')).allowed) allowed++;
      elapsed = performance.now() - started;
      msSeen.add(Math.floor(Date.now()));
    }
    // Never more than the bucket allows (1 ms of slack for the clocks' rounding), and several per ms it ran in.
    expect(allowed).toBeLessThanOrEqual(1 + 100 * (elapsed + 1));
    expect(allowed, `${allowed} allowed in ${msSeen.size} distinct ms`).toBeGreaterThan(3 * msSeen.size);
  });

  it('reads a clock that never goes back when it re-anchors on Date.now (a drained bucket would read that as a clock step)', () => {
    // Date.now 1000, and the monotonic clock moving on: 1000.7; then the two drift apart (the monotonic one runs 5 ms
    // ahead within the same ms of Date.now): re-anchored, it stays at 1000.7 rather than go back to 1000.
    let date = 1_000;
    let perf = 0;
    const clock = subMsClock(
      () => date,
      () => perf,
    );
    expect(clock()).toBe(1_000);
    perf = 0.7;
    expect(clock()).toBeCloseTo(1_000.7, 9);
    perf = 5.7;
    expect(clock()).toBeCloseTo(1_000.7, 9);
    // It follows Date.now on: the next ms, and a step back of the system clock.
    date = 1_001;
    perf = 6.2;
    expect(clock()).toBeCloseTo(1_001, 9);
    date = 500;
    expect(clock()).toBe(500);
  });

  it('counts fractions of a ms again once fake timers that were on when hasp loaded are gone', async () => {
    vi.useFakeTimers();
    let fresh: typeof import('../../packages/core/src/util/clock.js');
    try {
      vi.resetModules();
      fresh = await import('../../packages/core/src/util/clock.js');
      expect(fresh.wallNow() % 1).toBe(0);
    } finally {
      vi.useRealTimers();
    }
    // Real time again: within a few ms some reading falls between whole ms.
    const started = performance.now();
    let fraction = false;
    while (!fraction && performance.now() - started < 50) fraction = fresh.wallNow() % 1 !== 0;
    expect(fraction).toBe(true);
  });

  it('stands still under fake timers that replace only Date (no real fraction added to frozen time)', async () => {
    const bucket = new TokenBucket({ capacity: 10, rate: 10_000 });
    const frozen = Date.now();
    const spy = vi.spyOn(Date, 'now').mockReturnValue(frozen);
    try {
      expect(wallNow()).toBe(frozen);
      expect(await bucket.take('k', 10)).toMatchObject({ allowed: true, remaining: 0 });
      // A real ms passes (10 tokens' worth at this rate); the faked clock does not move.
      const started = performance.now();
      while (performance.now() - started < 1.5) {
        // busy: the point is real time passing with Date.now standing still
      }
      expect(wallNow()).toBe(frozen);
      expect(await bucket.peek('k')).toMatchObject({ allowed: false, remaining: 0 });
    } finally {
      spy.mockRestore();
    }
  });
});

describe('TokenBucket on Redis', () => {
  afterEach(() => {
    vi.restoreAllMocks();
  });

  it('runs one EVALSHA per take and per peek, and one DEL per reset (seen by MONITOR)', async () => {
    const client = node.client();
    await client.ping();
    const bucket = new TokenBucket({ capacity: 5, rate: '1/s', redis: client, prefix: uniquePrefix('mon') });
    const source = `127.0.0.1:${(client as unknown as { stream: { localPort: number } }).stream.localPort}`;
    const monitor = await node.client().monitor();
    const seen: string[][] = [];
    let ended = false;
    monitor.on('monitor', (_time: string, args: string[], from: string) => {
      if (from !== source) return;
      if (args[0]?.toLowerCase() === 'echo' && args[1] === 'end') ended = true;
      else seen.push(args);
    });
    try {
      // A flushed script cache costs one EVAL on the first call only (NOSCRIPT fallback).
      await admin.script('FLUSH');
      await client.echo('start');
      const decisions = [];
      for (let i = 0; i < 7; i++) decisions.push(await bucket.take('k'));
      await bucket.peek('k', 2);
      await bucket.reset('k');
      await bucket.take('k', 3);
      await client.echo('end');
      await until(() => ended, 5_000, 'MONITOR to show the end marker');
      expect(decisions.filter((d) => d.allowed)).toHaveLength(5);
      // A script call is EVALSHA or EVAL, or EVALSHA then EVAL when the server lost the script (NOSCRIPT).
      const commands: string[] = [];
      seen.forEach((args, i) => {
        const c = args[0]!.toLowerCase();
        if (c === 'eval' && seen[i - 1]![0]!.toLowerCase() === 'evalsha') return;
        commands.push(c === 'eval' || c === 'evalsha' ? 'script' : c);
      });
      // Takes 6 and 7 found the bucket that take 5 emptied: answered from memory, no command.
      expect(commands).toEqual(['echo', ...Array<string>(5).fill('script'), 'script', 'del', 'script']);
      // Each script call names exactly one key, its bucket's.
      for (const args of seen.filter((a) => a[0]!.toLowerCase().startsWith('eval'))) expect(args[2]).toBe('1');
    } finally {
      monitor.disconnect();
      client.disconnect();
    }
  });

  it('reads time from the Redis server: moving the client clock by an hour changes no decision', async () => {
    const bucket = new TokenBucket({ capacity: 3, rate: '1/min', redis: admin, prefix: uniquePrefix('clock') });
    expect((await bucket.take('k', 3)).allowed).toBe(true);
    const drained = await bucket.peek('k');
    expect(drained).toMatchObject({ allowed: false, remaining: 0 });
    const real = Date.now();
    for (const shift of [3_600_000, -3_600_000, 86_400_000]) {
      vi.spyOn(Date, 'now').mockReturnValue(real + shift);
      expect(Date.now()).toBe(real + shift);
      const d = await bucket.take('k');
      expect(d).toMatchObject({ allowed: false, limit: 3, remaining: 0 });
      // Only the real time that passed on the server counts (a few ms), not the shift. (These denials are answered
      // from memory, whose numbers may be a round trip later than the server's.)
      expect(d.retryAfter).toBeLessThanOrEqual(drained.retryAfter + 5);
      expect(d.retryAfter).toBeGreaterThan(drained.retryAfter - 1_000);
      expect(d.resetAfter).toBeLessThanOrEqual(drained.resetAfter + 5);
      expect(d.resetAfter).toBeGreaterThan(drained.resetAfter - 1_000);
      vi.restoreAllMocks();
    }
  });

  it('leaves no key behind: the key expires by the end of the second in which the bucket is full, peeks and denials write nothing', async () => {
    const prefix = uniquePrefix('exp');
    const bucket = new TokenBucket({ capacity: 3, rate: '10/s', redis: admin, prefix });
    await bucket.peek('k', 3);
    expect(await admin.keys(`${prefix}*`)).toEqual([]);
    const takenAfter = performance.now();
    const d = await bucket.take('k', 3);
    expect(d).toMatchObject({ allowed: true, remaining: 0, resetAfter: 300 });
    const [name] = await admin.keys(`${prefix}*`);
    expect(name).toBeDefined();
    // The key holds the TAT and expires at the end of the TAT's second on the server's clock (see TAKE).
    const tat = Number(await admin.get(name!));
    await expectExpiry(admin, name!, tat);
    expect(tat - (await serverMicros(admin))).toBeGreaterThan(200_000);
    // A denial leaves the key (and its expiry) as it was.
    expect((await bucket.take('k')).allowed).toBe(false);
    expect(Number(await admin.get(name!))).toBe(tat);
    await expectExpiry(admin, name!, tat);
    await until(async () => (await admin.exists(name!)) === 0, 3_000, 'the bucket key to expire');
    // Not before the bucket is full again (300 ms after the take reached the server), at most a second after.
    expect(performance.now() - takenAfter).toBeGreaterThanOrEqual(295);
    expect(performance.now() - takenAfter).toBeLessThan(1_300 + 500);
    expect(await bucket.peek('k', 3)).toMatchObject({ allowed: true, remaining: 0 });
    expect(await admin.keys(`${prefix}*`)).toEqual([]);
  });

  it('reads merged takes with one MGET, writes a key at most twice per command however many takes it has there, and keeps its expiry while its TAT stays in the same second (seen by MONITOR)', async () => {
    const client = node.client();
    await client.ping();
    const prefix = uniquePrefix('grid');
    // A token every µs: the bucket stays full, so each take writes a TAT a µs after the server's clock, and the takes,
    // over some ms, rarely see that clock pass into the next second.
    const bucket = new TokenBucket({ capacity: 1_000_000, rate: 1_000_000, redis: client, prefix });
    const monitor = await node.client().monitor();
    const scripts: string[][] = [];
    const inner: string[][] = [];
    const source = `127.0.0.1:${(client as unknown as { stream: { localPort: number } }).stream.localPort}`;
    let ended = false;
    monitor.on('monitor', (_time: string, args: string[], from: string) => {
      if (from === 'lua') inner.push(args.map((a) => a.toLowerCase()));
      else if (from === source && args[0]?.toLowerCase() === 'echo') ended = true;
      else if (from === source) scripts.push(args);
    });
    try {
      // Merged (several per command), then one by one.
      const merged = await Promise.all(Array.from({ length: 40 }, () => bucket.take('k')));
      for (let i = 0; i < 5; i++) merged.push(await bucket.take('k'));
      expect(merged.every((d) => d.allowed)).toBe(true);
      await client.echo('end');
      await until(() => ended, 5_000, 'MONITOR to show the end marker');
      const calls = scripts.filter((a) => a[0]!.toLowerCase() === 'evalsha' || a[0]!.toLowerCase() === 'eval');
      expect(calls.length).toBeLessThan(45);
      const commands = inner.map((a) => a[0]);
      // One MGET per script call (the first on a connection is EVAL, so none meets NOSCRIPT), no GET.
      expect(commands.filter((c) => c === 'mget').length).toBe(calls.length);
      expect(commands).not.toContain('get');
      const sets = inner.filter((a) => a[0] === 'set');
      // Per script call: a SET for its first take on the key and, when later takes of the same call moved the TAT,
      // one more with the last of them, not one per take. The 40 merged takes go in commands of 8 (one callback).
      const merged8 = calls.filter((a) => Number(a[2]) > 1).length;
      expect(merged8).toBeGreaterThan(0);
      expect(sets).toHaveLength(calls.length + merged8);
      // The first creates the key (NX: MGET reads a key of another type as none); a new expiry only when the TAT
      // crosses into the next second; every other write keeps the expiry.
      expect(sets[0]).toContain('nx');
      expect(sets.filter((a) => a.includes('px')).length).toBeLessThanOrEqual(2);
      expect(sets.filter((a) => a.includes('keepttl')).length).toBeGreaterThanOrEqual(sets.length - 2);
      const [name] = await admin.keys(`${prefix}*`);
      const tat = Number(await admin.get(name!));
      await expectExpiry(admin, name!, tat);
    } finally {
      monitor.disconnect();
      client.disconnect();
    }
  });

  it('fails a take on a key of another type, or holding no number, alone, and leaves that key as it was', async () => {
    const client = node.client();
    await client.ping();
    const prefix = uniquePrefix('type');
    const bucket = new TokenBucket({ capacity: 5, rate: '1/min', redis: client, prefix });
    await admin.hset(bucketKey(bucket, prefix, 'hash'), 'f', '1');
    await admin.set(bucketKey(bucket, prefix, 'text'), 'abc');
    // Lua's tonumber reads these as numbers: NaN would fail every comparison and admit every take, writing nothing.
    const odd = ['nan', 'inf', '-inf'];
    for (const v of odd) await admin.set(bucketKey(bucket, prefix, v), v);
    const wrongType = /WRONGTYPE/;
    const notNumber = /not a number/;
    // Merged into one command each (takes, then peeks: their leading arguments differ), then one by one.
    const settled = await Promise.allSettled([
      bucket.take('ok'),
      bucket.take('hash'),
      bucket.take('text'),
      bucket.take('ok'),
      bucket.peek('hash'),
      bucket.peek('free'),
      bucket.peek('text'),
    ]);
    const alone: PromiseSettledResult<Decision>[] = [];
    for (const call of [() => bucket.take('hash'), () => bucket.peek('hash'), () => bucket.take('text')]) {
      alone.push(...(await Promise.allSettled([call()])));
    }
    const oddMerged = await Promise.allSettled([bucket.take('ok'), ...odd.map((v) => bucket.take(v))]);
    const oddAlone: PromiseSettledResult<Decision>[] = [];
    for (const v of odd) oddAlone.push(...(await Promise.allSettled([bucket.take(v)])));
    const outcome = (r: PromiseSettledResult<Decision>): unknown =>
      r.status === 'fulfilled' ? r.value.remaining : ((r.reason as Error).constructor.name + ': ' + (r.reason as Error).message);
    const [ok1, hash, text, ok2, peekHash, peekFree, peekText] = settled.map(outcome);
    // (A peek answers what would remain after taking its cost.)
    expect([ok1, ok2, peekFree]).toEqual([4, 3, 4]);
    for (const e of [hash, peekHash, outcome(alone[0]!), outcome(alone[1]!)]) {
      expect(e).toMatch(/^RateLimitUnavailableError: /);
      expect(e).toMatch(wrongType);
    }
    for (const e of [text, peekText, outcome(alone[2]!), ...oddMerged.slice(1).map(outcome), ...oddAlone.map(outcome)]) {
      expect(e).toMatch(/^RateLimitUnavailableError: /);
      expect(e).toMatch(notNumber);
    }
    expect(outcome(oddMerged[0]!)).toBe(2);
    for (const v of odd) expect(await admin.get(bucketKey(bucket, prefix, v))).toBe(v);
    expect(await admin.hgetall(bucketKey(bucket, prefix, 'hash'))).toEqual({ f: '1' });
    expect(await admin.get(bucketKey(bucket, prefix, 'text'))).toBe('abc');
    expect(await admin.pttl(bucketKey(bucket, prefix, 'text'))).toBe(-1);
    client.disconnect();
  });

  // On 20 connections each take is a command of its own; on one shared connection the takes merge, many on the same
  // key in one command (written once at its end).
  it.each([
    ['20 concurrent connections', 20],
    ['20 concurrent takers sharing one connection', 1],
  ])('never admits more than capacity + rate × elapsed to %s, and no fewer under full demand', async (_what, connections) => {
    const capacity = 20;
    const rate = 200;
    const prefix = uniquePrefix('race');
    const clients = Array.from({ length: connections }, () => node.client());
    await Promise.all(clients.map((c) => c.ping()));
    const buckets = Array.from({ length: 20 }, (_, i) => new TokenBucket({ capacity, rate, redis: clients[i % connections]!, prefix }));
    const runMs = 1_500;
    let admitted = 0;
    let calls = 0;
    let firstDone!: () => void;
    const first = new Promise<void>((resolve) => (firstDone = resolve));

    const t0 = await serverMicros(admin);
    const deadline = performance.now() + runMs;
    const workers = buckets.map(async (bucket, w) => {
      for (let i = 0; i < 5_000_000 && performance.now() < deadline; i++) {
        const cost = 1 + ((w + i) % 3);
        calls++;
        const d = await bucket.take('hot', cost);
        firstDone();
        if (d.allowed) admitted += cost;
        // A denial may be answered from memory without any I/O: a caller that asks again at once must still let the
        // event loop run (as any real caller, whose next take comes from I/O, does).
        else await new Promise((resolve) => setImmediate(resolve));
      }
    });
    // The inner window: from after the first take has been answered until before the workers stop asking.
    await first;
    const innerStart = await serverMicros(admin);
    await new Promise((resolve) => setTimeout(resolve, runMs - 300));
    const innerEnd = await serverMicros(admin);
    await Promise.all(workers);
    const t1 = await serverMicros(admin);

    const outer = capacity + (rate * (t1 - t0)) / 1e6;
    const inner = capacity + (rate * (innerEnd - innerStart)) / 1e6;
    expect(calls).toBeGreaterThan(admitted / 2);
    expect(admitted).toBeLessThanOrEqual(outer);
    // Demand never stopped from the first answer until well after the inner window, so every token that came back
    // in it was taken by the end (less at most one take of the largest cost, 3, still waiting for its tokens).
    expect(admitted).toBeGreaterThanOrEqual(inner - 3);
    for (const c of clients) c.disconnect();
  });

  it('answers a take whose cost is a tiny fraction of a microsecond of refill (no zero expiry)', async () => {
    const bucket = new TokenBucket({ capacity: 10, rate: 1_000_000, redis: admin, prefix: uniquePrefix('tiny') });
    expect(await bucket.take('k', 1e-9)).toMatchObject({ allowed: true, retryAfter: 0 });
    expect(await bucket.take('k', 0.1)).toMatchObject({ allowed: true, retryAfter: 0 });
  });

  it('keeps buckets of other capacities or rates on the same prefix and key apart: each keeps its own budget', async () => {
    // Two routes on one policy, or a deploy that changes a limit while old processes still run. Each take through a
    // bucket object of its own, as from many processes (an object answers a key it saw short of tokens from memory).
    const prefix = uniquePrefix('settings');
    const bucket = (capacity: number, rate = '10/h') => new TokenBucket({ capacity, rate, redis: admin, prefix });
    const take = async (capacity: number) => (await bucket(capacity).take('k')).allowed;
    // Sharing one value, the small bucket read the drained big one as a clock step back, and its denial wrote the value
    // down to its own capacity, handing the big one back 7 tokens each time.
    const admitted = { big: 0, small: 0 };
    for (let i = 0; i < 12; i++) if (await take(10)) admitted.big++;
    for (let round = 0; round < 10; round++) {
      if (await take(3)) admitted.small++;
      if (await take(10)) admitted.big++;
    }
    expect(admitted).toEqual({ big: 10, small: 3 });
    // A bucket of another rate reads nothing of theirs either: its 10 tokens are all there.
    const slower = bucket(10, '1/h');
    expect((await slower.peek('k', 10)).allowed).toBe(true);
    const names = [bucket(10), bucket(3), slower].map((b) => bucketKey(b, prefix, 'k'));
    expect(new Set(names).size).toBe(3);
    expect((await admin.keys(`${prefix}*`)).sort()).toEqual(names.slice(0, 2).sort());
  });

  it('keeps hostile keys inside the prefix and apart from each other', async () => {
    await node.flush();
    const prefix = uniquePrefix('keys');
    const keys = [
      'plain',
      '}',
      '{',
      '{}',
      'a}',
      'a%7D',
      '%7D',
      '%25',
      'a\0b',
      'a\0c',
      '\n',
      '\r\n',
      '\uD800',
      '\uDBFF',
      '\uDC00',
      '\uFFFD',
      '%ud800',
      '\uD83D\uDE00',
      `${prefix}{plain}`,
      'plain}',
      '{plain}',
      'k'.repeat(1 << 20),
      `${'k'.repeat(1 << 20)}x`,
    ];
    const capacity = keys.length + 1;
    const bucket = new TokenBucket({ capacity, rate: '1/h', redis: admin, prefix });
    for (const [i, key] of keys.entries()) expect((await bucket.take(key, i + 1)).remaining).toBe(capacity - i - 1);
    // Each key kept its own budget.
    for (const [i, key] of keys.entries()) expect((await bucket.peek(key, 1)).remaining).toBe(capacity - i - 2);
    const names = await admin.keys('*');
    expect(names).toHaveLength(keys.length);
    for (const name of names) expect(name.startsWith(prefix), name.slice(0, 80)).toBe(true);
    // And each one can be reset alone.
    await bucket.reset('\uD800');
    expect((await bucket.peek('\uDBFF', 1)).remaining).toBe(capacity - keys.indexOf('\uDBFF') - 2);
    expect((await bucket.peek('\uFFFD', 1)).remaining).toBe(capacity - keys.indexOf('\uFFFD') - 2);
    expect((await bucket.peek('\uD800', 1)).remaining).toBe(capacity - 1);
    expect(await admin.dbsize()).toBe(keys.length - 1);
  });

  it('stores a key longer than 128 characters under a digest, in Redis and in memory, and keeps long keys apart', async () => {
    const prefix = uniquePrefix('long');
    const onRedis = new TokenBucket({ capacity: 2, rate: '1/h', redis: admin, prefix });
    const inMemory = new TokenBucket({ capacity: 2, rate: '1/h', clock: manualClock().now });
    const long = 'p'.repeat(100_000);
    for (const bucket of [onRedis, inMemory]) {
      expect(await bucket.take(long)).toMatchObject({ allowed: true, remaining: 1 });
      expect(await bucket.take(`${long}x`)).toMatchObject({ allowed: true, remaining: 1 });
      expect(await bucket.take(long)).toMatchObject({ allowed: true, remaining: 0 });
      expect((await bucket.take(long)).allowed).toBe(false);
    }
    const name = bucketKey(onRedis, prefix, long);
    expect(name.length).toBeLessThan(prefix.length + 60);
    expect(Number(await admin.memory('USAGE', name))).toBeLessThan(150);
    // In memory, a bucket is kept under the same short spelling.
    const stored = [...(memoryStore(inMemory) as unknown as { tats: Map<string, number> }).tats.keys()];
    expect(stored).toHaveLength(2);
    for (const k of stored) expect(k.length).toBeLessThanOrEqual(45);
  });

  it('keeps hostile keys apart in memory too', async () => {
    const bucket = new TokenBucket({ capacity: 10, rate: '1/h' });
    const keys = ['\uD800', '\uDBFF', '\uFFFD', 'a\0b', 'a\0c', '}', '%7D', 'k'.repeat(1 << 20)];
    for (const [i, key] of keys.entries()) await bucket.take(key, i + 1);
    for (const [i, key] of keys.entries()) expect((await bucket.peek(key)).remaining).toBe(10 - i - 2);
  });
});

describe('TokenBucket when Redis fails', () => {
  let down: RedisNode;
  const clients: Redis[] = [];

  /** A bucket on a client with ioredis's default options (the harness only adds an error listener). */
  const bucketOn = (options: { timeout?: number } = {}): { redis: Redis; bucket: TokenBucket } => {
    const redis = down.client();
    clients.push(redis);
    return { redis, bucket: new TokenBucket({ capacity: 2, rate: '1/min', redis, prefix: uniquePrefix('down'), ...options }) };
  };

  const expectUnavailable = (error: unknown): void => {
    expect(error).toBeInstanceOf(RateLimitUnavailableError);
    expect(error).toMatchObject({ code: 'RATE_LIMIT_UNAVAILABLE', name: 'RateLimitUnavailableError' });
    expect((error as Error).cause).toBeDefined();
  };

  beforeAll(async () => {
    down = await startRedis();
  });

  afterEach(async () => {
    for (const c of clients.splice(0)) c.disconnect();
  });

  it('rejects RateLimitUnavailableError soon after the server is killed, and works again after a restart', async () => {
    const { redis, bucket } = bucketOn();
    expect((await bucket.take('k')).allowed).toBe(true);
    await down.kill();
    for (const op of [() => bucket.take('k'), () => bucket.peek('k'), () => bucket.reset('k'), () => bucket.take('k')]) {
      const started = performance.now();
      expectUnavailable(await within(rejection(op()), 4_000, 'a call on a dead server'));
      // The default timeout (2 s) bounds it; ioredis's own retry budget would take far longer.
      expect(performance.now() - started).toBeLessThan(3_000);
    }
    await down.restart();
    await until(async () => (await redis.ping().catch(() => 'down')) === 'PONG', 10_000, 'the client to reconnect');
    // The server lost its data, so the bucket is full again; but ioredis re-sends the take that was in flight when the
    // socket died (autoResendUnfulfilledCommands), so that take, already failed for its caller, may count now.
    const d = await bucket.take('k');
    expect(d.allowed).toBe(true);
    expect(d.remaining).toBeLessThanOrEqual(1);
  });

  it('rejects within the default 2 s timeout while the server is frozen, then works again after it thaws', async () => {
    const { redis, bucket } = bucketOn();
    expect(await redis.ping()).toBe('PONG');
    down.pause();
    try {
      const started = performance.now();
      expectUnavailable(await within(rejection(bucket.take('k')), 4_000, 'take on a frozen server'));
      const took = performance.now() - started;
      expect(took).toBeGreaterThanOrEqual(1_950);
      expect(took).toBeLessThan(3_000);
    } finally {
      down.resume();
    }
    // The take that timed out still ran once the server thawed: it counted (a timeout never admits more).
    expect(await bucket.take('k')).toMatchObject({ allowed: true, remaining: 0 });
  });

  it('gives back the tokens of a take that landed after its caller gave up, while nothing else touched the bucket', async () => {
    const redis = down.client();
    clients.push(redis);
    const bucket = new TokenBucket({ capacity: 3, rate: '3/10min', redis, prefix: uniquePrefix('refund'), timeout: 200 });
    expect(await redis.ping()).toBe('PONG');
    down.pause();
    try {
      expectUnavailable(await within(rejection(bucket.take('sms')), 2_000, 'take on a frozen server'));
    } finally {
      down.resume();
    }
    // The take ran once the server thawed, and its tokens came back: the budget is whole again (a peek reports what
    // would remain after taking one).
    await until(async () => (await bucket.peek('sms')).remaining === 2, 2_000, 'the refund');
    expect((await bucket.take('sms')).remaining).toBe(2);
    expect((await bucket.take('sms')).remaining).toBe(1);
  });

  it('gives back every one of several late takes on one key that shared a command (newest first)', async () => {
    const redis = down.client();
    clients.push(redis);
    const bucket = new TokenBucket({ capacity: 3, rate: '3/10min', redis, prefix: uniquePrefix('refund-many'), timeout: 200 });
    expect(await redis.ping()).toBe('PONG');
    down.pause();
    try {
      // Made in one callback: they go out as one command, and their late replies come back together, oldest first.
      const takes = [bucket.take('sms'), bucket.take('sms')].map((t) => rejection(t));
      for (const error of await within(Promise.all(takes), 2_000, 'takes on a frozen server')) expectUnavailable(error);
    } finally {
      down.resume();
    }
    // Only the newest take's TAT is the bucket's: given back first, it leaves the older one's, which then goes back too.
    await until(async () => (await bucket.peek('sms')).remaining === 2, 2_000, 'both refunds');
  });

  it('gives back a late take before a take this process makes in the turn its late reply came', async () => {
    const proxy = await startProxy(down.port);
    const redis = new Redis({ host: '127.0.0.1', port: proxy.port });
    redis.on('error', () => undefined);
    clients.push(redis);
    const prefix = uniquePrefix('refund-turn');
    const bucket = new TokenBucket({ capacity: 3, rate: '3/10min', redis, prefix, timeout: 200 });
    try {
      expect(await redis.ping()).toBe('PONG');
      const letGo = proxy.holdReplies();
      const late = rejection(bucket.take('sms'));
      // Its reply comes in the same socket read as this PING's, whose reaction takes again a few hops later.
      const second = redis.ping().then(async () => {
        for (let i = 0; i < 20; i++) await null;
        return bucket.take('sms');
      });
      expectUnavailable(await within(late, 2_000, 'a take whose reply is held'));
      letGo();
      // The late take's tokens came back before the second take: it leaves two, not one.
      expect(await within(second, 2_000, 'the second take')).toMatchObject({ allowed: true, remaining: 2 });
    } finally {
      await proxy.close();
    }
  });

  it('gives back a late take on a bucket in use: the key holds the TAT before it again, with an expiry that covers it', async () => {
    const redis = down.client();
    clients.push(redis);
    const prefix = uniquePrefix('refund3');
    const bucket = new TokenBucket({ capacity: 3, rate: '3/10min', redis, prefix, timeout: 200 });
    expect((await bucket.take('sms')).remaining).toBe(2);
    const name = bucketKey(bucket, prefix, 'sms');
    const before = await redis.get(name);
    down.pause();
    try {
      expectUnavailable(await within(rejection(bucket.take('sms')), 2_000, 'take on a frozen server'));
    } finally {
      down.resume();
    }
    await until(async () => (await redis.get(name)) === before, 2_000, 'the refund');
    expect((await bucket.peek('sms')).remaining).toBe(1);
    // Expiring at the end of that TAT's second, as TAKE had left it.
    await expectExpiry(redis, name, Number(before));
  });

  it('keeps the tokens of a late take once another take has built on it (a refund then could admit too much)', async () => {
    const redis = down.client();
    clients.push(redis);
    const prefix = uniquePrefix('refund2');
    const impatient = new TokenBucket({ capacity: 3, rate: '3/10min', redis, prefix, timeout: 200 });
    const patient = new TokenBucket({ capacity: 3, rate: '3/10min', redis, prefix, timeout: 10_000 });
    expect(await redis.ping()).toBe('PONG');
    let later: Promise<unknown>;
    down.pause();
    try {
      // On one connection, so the server runs them in this order: the impatient take (given up on), then the patient
      // one, then (once the first reply is back) the first take's refund, which finds the second counted on top.
      expectUnavailable(await within(rejection(impatient.take('sms')), 2_000, 'take on a frozen server'));
      later = patient.take('sms');
    } finally {
      down.resume();
    }
    expect(await later).toMatchObject({ allowed: true, remaining: 1 });
    // Wait out the refund attempt: it must not give the first take's token back, which would also erase the second.
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect((await patient.peek('sms')).remaining).toBe(0);
    expect((await patient.take('sms')).allowed).toBe(true);
    expect((await patient.take('sms')).allowed).toBe(false);
  });

  it('rejects at once when the client was quit', async () => {
    const { redis, bucket } = bucketOn();
    expect((await bucket.take('k')).allowed).toBe(true);
    await redis.quit();
    const started = performance.now();
    expectUnavailable(await within(rejection(bucket.take('k')), 1_000, 'take on a quit client'));
    expect(performance.now() - started).toBeLessThan(500);
  });

  it('honours the timeout option on a frozen server', async () => {
    const { redis, bucket } = bucketOn({ timeout: 200 });
    expect(await redis.ping()).toBe('PONG');
    down.pause();
    try {
      const started = performance.now();
      expectUnavailable(await within(rejection(bucket.peek('k')), 2_000, 'peek on a frozen server'));
      const took = performance.now() - started;
      expect(took).toBeGreaterThanOrEqual(190);
      expect(took).toBeLessThan(1_000);
    } finally {
      down.resume();
    }
    expect((await bucket.peek('k')).allowed).toBe(true);
  });
});

describe('TokenBucket arguments', () => {
  const ok = { capacity: 5, rate: 1 };

  it.each([
    ['capacity', { rate: 1 }],
    ['capacity', { capacity: 0, rate: 1 }],
    ['capacity', { capacity: -1, rate: 1 }],
    ['capacity', { capacity: Number.NaN, rate: 1 }],
    ['capacity', { capacity: Number.POSITIVE_INFINITY, rate: 1 }],
    ['capacity', { capacity: '10', rate: 1 }],
    ['capacity', { capacity: null, rate: 1 }],
    ['rate', { capacity: 1 }],
    ['rate', { capacity: 1, rate: 0 }],
    ['rate', { capacity: 1, rate: -2 }],
    ['rate', { capacity: 1, rate: Number.NaN }],
    ['rate', { capacity: 1, rate: Number.POSITIVE_INFINITY }],
    ['rate', { capacity: 1, rate: '' }],
    ['rate', { capacity: 1, rate: 'fast' }],
    ['rate', { capacity: 1, rate: '5' }],
    ['rate', { capacity: 1, rate: '5/' }],
    ['rate', { capacity: 1, rate: '/s' }],
    ['rate', { capacity: 1, rate: '0/s' }],
    ['rate', { capacity: 1, rate: '5/0s' }],
    ['rate', { capacity: 1, rate: '-5/s' }],
    ['rate', { capacity: 1, rate: '5/fortnight' }],
    ['rate', { capacity: 1, rate: '1e3/s' }],
    ['rate', { capacity: 1, rate: `${'9'.repeat(400)}/s` }],
    ['rate', { capacity: 1, rate: `1/${'9'.repeat(400)}d` }],
    ['rate', { capacity: 1, rate: {} }],
    ['rate', { capacity: 1, rate: null }],
    // Beyond a microsecond per token the bucket could not keep its rate.
    ['rate', { capacity: 1, rate: 2_000_000 }],
    // Buckets that would take ages to refill lose precision (and break Redis expiry): rejected up front.
    ['capacity', { capacity: 1e9, rate: '1/d' }],
    ['rate', { capacity: 1, rate: 1e-300 }],
    // Every take costs at least 1 µs of refill: a smaller bucket could never grant anything.
    ['capacity', { capacity: 0.5, rate: 1_000_000 }],
    ['redis', { ...ok, redis: {} }],
    ['redis', { ...ok, redis: 'redis://localhost' }],
    ['redis', { ...ok, redis: null }],
    ['prefix', { ...ok, prefix: 5 }],
    ['prefix', { ...ok, prefix: null }],
    ['prefix', { ...ok, prefix: 'app{x}:' }],
    ['timeout', { ...ok, timeout: 0 }],
    ['timeout', { ...ok, timeout: -1 }],
    ['timeout', { ...ok, timeout: 1.5 }],
    ['timeout', { ...ok, timeout: Number.NaN }],
    ['timeout', { ...ok, timeout: '100' }],
    ['clock', { ...ok, clock: 5 }],
    ['clock', { ...ok, clock: () => new Date() }],
    ['clock', { ...ok, clock: () => NaN }],
    ['clock', { ...ok, clock: () => '1700000000000' }],
    ['capcity', { capcity: 5, rate: 1 }],
    ['ttl', { ...ok, ttl: 100 }],
  ])('rejects a bad %s at construction', async (option, options) => {
    await expectInvalid(() => new TokenBucket(options as never), option);
  });

  it('fails a take naming clock when the clock stops answering a finite number, instead of refusing everything', async () => {
    let now = 1_000;
    const bucket = new TokenBucket({ ...ok, clock: () => now });
    expect((await bucket.take('k')).allowed).toBe(true);
    now = NaN;
    await expect(bucket.take('k')).rejects.toThrow(/^clock must return a finite number of ms, got NaN$/);
    now = 1_001;
    expect((await bucket.take('k')).allowed).toBe(true);
  });

  it('gives a take back without a throw when the clock has gone bad since (the give-back runs after the response)', async () => {
    let now = 1_000;
    const bucket = new TokenBucket({ capacity: 2, rate: 1, clock: () => now });
    const limiter = new RateLimiter({ bucket }, () => 'k');
    const home = {};
    expect((await limiter.check({}, home))?.allowed).toBe(true);
    now = NaN;
    await expect(Promise.resolve().then(() => giveBackTakes(home))).resolves.toBeUndefined();
    now = 1_001;
    expect((await limiter.check({}, home))?.allowed).toBe(true);
    // A clock that throws, likewise.
    const broken = new TokenBucket({
      capacity: 2,
      rate: 1,
      clock: () => {
        if (now === 0) throw new Error('clock broke');
        return now;
      },
    });
    const other = {};
    expect((await new RateLimiter({ bucket: broken }, () => 'k').check({}, other))?.allowed).toBe(true);
    now = 0;
    await expect(Promise.resolve().then(() => giveBackTakes(other))).resolves.toBeUndefined();
    await expect(broken.take('k')).rejects.toThrow(/^clock threw: clock broke$/);
  });

  it('validates clock and timeout also when a Redis client is given', async () => {
    await expectInvalid(() => new TokenBucket({ ...ok, redis: admin, clock: 5 } as never), 'clock');
    await expectInvalid(() => new TokenBucket({ ...ok, clock: Date.now, timeout: 0 }), 'timeout');
  });

  it('rejects options that are not an object', async () => {
    for (const options of [undefined, null, 'capacity=5', 5]) {
      expect(() => new TokenBucket(options as never)).toThrow(TypeError);
    }
  });

  it.each(backends)('rejects bad keys and costs at once, before any Redis call ($name)', async (backend) => {
    const bucket = backend.make({ capacity: 5, rate: 1 });
    for (const op of ['take', 'peek'] as const) {
      await expectInvalid(() => bucket[op](''), 'key');
      await expectInvalid(() => bucket[op](5 as never), 'key');
      await expectInvalid(() => bucket[op](undefined as never), 'key');
      for (const cost of [0, -1, Number.NaN, Number.POSITIVE_INFINITY, '1', null, 6, 5.0001]) {
        await expectInvalid(() => bucket[op]('k', cost as never), 'cost');
      }
    }
    await expectInvalid(() => bucket.reset(''), 'key');
    await expectInvalid(() => bucket.reset({} as never), 'key');
    // As promises (as the lockers' calls are): `.catch` on the call sees them.
    for (const call of [() => bucket.take(''), () => bucket.peek('k', 0), () => bucket.reset('')]) {
      let result: unknown;
      expect(() => (result = call())).not.toThrow();
      await expect(result).rejects.toBeInstanceOf(RangeError);
    }
    expect(await bucket.take('k', 5)).toMatchObject({ allowed: true, remaining: 0 });
  });
});
