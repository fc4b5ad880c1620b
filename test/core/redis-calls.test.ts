// How hasp talks to Redis on its hot path: calls made together go out merged into one command, a script's first call on
// a connection is one EVAL (no NOSCRIPT round trip), and every call still fails within its timeout on a frozen server.
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  LockBusyError,
  LockLostError,
  LockUnavailableError,
  RateLimitUnavailableError,
  RedisLock,
  Redlock,
  TokenBucket,
  type Lease,
  type LockErrorEvent,
} from '../../packages/core/src/index.js';
import { lockNames } from '../../packages/core/src/lock/redis-store.js';
import {
  ACQUIRE,
  EXTEND,
  FENCE_RENEW_US,
  FENCE_RETENTION_MS,
  LEAVE,
  RAISE_FENCE,
  RELEASE,
  RESTORE,
  TRANSFER,
  WAKE,
} from '../../packages/core/src/lock/scripts.lua.js';
import { REFUND, TAKE } from '../../packages/core/src/rate-limit/bucket.lua.js';
import { isBundled } from '../../packages/core/src/redis/script.js';
import { inspect } from 'node:util';
import { startProxy } from '../harness/proxy.js';
import { startRedis, stopAll, type RedisNode } from '../harness/redis.js';
import { trackUnhandled } from '../redlock/support.js';
import { abortReason, bucketKey, commandStats as statsOf, refusalCounter, rejection, scriptCommands as scriptsOf, uniquePrefix, until, within } from './helpers.js';

let node: RedisNode;
let admin: Redis;

beforeAll(async () => {
  node = await startRedis();
  admin = node.client();
  await admin.ping();
});

afterAll(async () => {
  await stopAll();
});

/** The server's count of socket reads (INFO stats), which grows by one per write a client makes (small writes). */
async function reads(): Promise<number> {
  const info = await admin.info('stats');
  return Number(/total_reads_processed:(\d+)/.exec(info)![1]);
}

/** Calls and failures of one command on our node since the last RESETSTAT. */
function commandStats(name: string): Promise<{ calls: number; failed: number }> {
  return statsOf(admin, name);
}

/** Script commands our node ran since the last RESETSTAT. */
function scriptCommands(): Promise<number> {
  return scriptsOf(admin);
}

/** A client of our own, connected. */
async function connected(): Promise<Redis> {
  const client = node.client();
  await client.ping();
  return client;
}

/** Two RedisLocks on `prefix`, each on its own connection, as two processes would have them; `close` ends both. */
function twoLockers(prefix: string, options: { ttl?: number } = {}): { ours: RedisLock; theirs: RedisLock; close(): void } {
  const clients = [node.client(), node.client()];
  const [ours, theirs] = clients.map((c) => new RedisLock(c, { prefix, ...options })) as [RedisLock, RedisLock];
  return {
    ours,
    theirs,
    close: () => {
      ours.close();
      theirs.close();
      for (const c of clients) c.disconnect();
    },
  };
}

/**
 * A RedisLock (ttl 20 s, timeout 1 s unless given) on a server of its own, which the test may pause, and a client to
 * look with. The locker's client talks through a proxy that reports what it sends.
 */
async function pausableLock(tag: string, timeout = 1_000) {
  const own = await startRedis();
  const proxy = await startProxy(own.port);
  const client = new Redis({ host: '127.0.0.1', port: proxy.port });
  const probe = own.client();
  await Promise.all([client.ping(), probe.ping()]);
  const prefix = uniquePrefix(tag);
  const locks = new RedisLock(client, { prefix, ttl: 20_000, timeout });
  const names = lockNames(prefix, 'k');
  return {
    own,
    proxy,
    client,
    probe,
    names,
    locks,
    /**
     * Waits until the server has run `n` scripts of the locker in all, and the locker has read their replies. Before a
     * pause: a waiter is let in at a release only once its refusals have told it that it is first in line.
     */
    async scriptsRun(n: number): Promise<void> {
      await until(async () => (await scriptsOf(probe)) >= n, 3_000, `${n} script calls`);
      await client.ping();
    },
    /** Redis has recorded `lease` as the holder of `k` (its token, fence and full ttl), with nobody left in line. */
    async expectHolder(lease: Lease): Promise<void> {
      expect((await probe.get(names.lock))?.startsWith(`${lease.token} ${lease.fence} 1 0 `)).toBe(true);
      expect(await probe.get(names.fence)).toBe(String(lease.fence));
      expect(await probe.pttl(names.lock)).toBeGreaterThan(19_000);
      expect(await probe.zcard(names.queue)).toBe(0);
    },
    /**
     * Redis records the hand-over from `held` to `next`: the lease gets its own ttl and is the holder there. Then it is
     * released, which frees the lock.
     */
    async expectRecorded(next: Lease, held: Lease): Promise<void> {
      await until(() => Promise.resolve(next.expiresAt > held.expiresAt), 3_000, 'the hand-over to be recorded');
      await this.expectHolder(next);
      expect(next.signal.aborted).toBe(false);
      expect(await next.release()).toBe(true);
      expect(await probe.exists(names.lock)).toBe(0);
    },
    async close(): Promise<void> {
      locks.close();
      client.disconnect();
      await proxy.close();
      await own.stop();
    },
  };
}

/**
 * Whether each lease got its own call's reply: its key's lock in Redis holds its token and fence. (Fences alone cannot
 * tell: the calls of one merged command read one clock, so leases on different keys may share a fence.)
 */
async function ownReplies(prefix: string, leases: readonly Lease[]): Promise<boolean> {
  const held = await admin.mget(...leases.map((l) => lockNames(prefix, l.key).lock));
  return leases.every((l, i) => held[i]?.startsWith(`${l.token} ${l.fence} `) === true) && new Set(leases.map((l) => l.token)).size === leases.length;
}

/** Waits until `n` waiters are in the line of `key` under `prefix`. */
function queued(prefix: string, key: string, n: number, what: string): Promise<void> {
  return until(async () => (await admin.zcard(lockNames(prefix, key).queue)) === n, 2_000, what);
}

describe('Redis calls', () => {
  it('writes the calls made in one tick on one client together: 50 acquires and 50 releases in a few reads', async () => {
    const client = await connected();
    const prefix = uniquePrefix('batch');
    const locks = new RedisLock(client, { prefix });
    // Warm the connection's script cache, so the batch below is all EVALSHA.
    await (await locks.acquire('warm')).release();
    const keys = Array.from({ length: 50 }, (_, i) => `k${i}`);
    const before = await reads();
    const leases = await Promise.all(keys.map((k) => locks.acquire(k)));
    const afterAcquire = await reads();
    expect(await ownReplies(prefix, leases)).toBe(true);
    const released = await Promise.all(leases.map((l) => l.release()));
    const afterRelease = await reads();
    expect(released.every(Boolean)).toBe(true);
    // Writes of up to 8 calls on one server (7 for 50), and one read for the INFO call itself; unbatched, each phase
    // would take 50.
    expect(afterAcquire - before).toBeLessThanOrEqual(10);
    expect(afterRelease - afterAcquire).toBeLessThanOrEqual(10);
    // Every lock is free again.
    expect((await Promise.all(keys.map((k) => locks.tryAcquire(k)))).every((l) => l !== null)).toBe(true);
    locks.close();
    client.disconnect();
  });

  it('merges the calls made in one turn on one connection into a few commands, and answers each call its own reply', async () => {
    const client = await connected();
    const prefix = uniquePrefix('merge');
    const locks = new RedisLock(client, { prefix });
    const bucket = new TokenBucket({ capacity: 2, rate: '1/min', redis: client, prefix });
    await (await locks.acquire('warm')).release();
    await admin.config('RESETSTAT');
    // 50 acquires and 30 takes (10 keys × 3, the third of each refused) in one turn: batches of at most 8 per command.
    const leasesP = Array.from({ length: 50 }, (_, i) => locks.acquire(`k${i}`));
    const takesP = Array.from({ length: 30 }, (_, i) => bucket.take(`b${i % 10}`));
    const [leases, takes] = await Promise.all([Promise.all(leasesP), Promise.all(takesP)]);
    const scripts = await scriptCommands();
    expect(scripts).toBeGreaterThanOrEqual(2);
    expect(scripts).toBeLessThanOrEqual(10);
    expect(await ownReplies(prefix, leases)).toBe(true);
    // One clock read per command at most, not one per acquire and take: the calls of a merged command run at one
    // instant anyway (Redis runs a script atomically), and each TIME costs Redis about as much as a lock's SET.
    expect((await commandStats('time')).calls).toBeLessThanOrEqual(scripts);
    expect(takes.map((t) => t.allowed)).toEqual([...Array<boolean>(20).fill(true), ...Array<boolean>(10).fill(false)]);
    expect(takes.slice(0, 10).every((t) => t.remaining === 1)).toBe(true);
    expect(takes.slice(20).every((t) => t.remaining === 0 && t.retryAfter > 0)).toBe(true);
    expect((await Promise.all(leases.map((l) => l.release()))).every(Boolean)).toBe(true);
    expect(await admin.exists(...leases.map((_, i) => lockNames(prefix, `k${i}`).lock))).toBe(0);
    locks.close();
    client.disconnect();
  });

  it('can merge a call of any of its own scripts with other calls (no script reads KEYS or ARGV as a whole)', () => {
    // A script the bundle cannot hold goes out as a command of its own for every call, which costs Redlock's
    // uncontended cycle about a sixth of its throughput: a comment naming KEYS in a script's source was enough.
    const scripts = { ACQUIRE, EXTEND, RELEASE, TRANSFER, LEAVE, WAKE, RAISE_FENCE, RESTORE, TAKE, REFUND };
    for (const [name, script] of Object.entries(scripts)) expect(isBundled(script), name).toBe(true);
  });

  it('merges takes made in many callbacks of one turn into one command, and those of one callback by eights', async () => {
    const client = await connected();
    const prefix = uniquePrefix('turn');
    const bucket = new TokenBucket({ capacity: 10, rate: '1/min', redis: client, prefix });
    // Warm the connection's script cache, so every command below is one EVALSHA.
    await Promise.all([bucket.take('warm'), bucket.take('warm')]);
    await admin.config('RESETSTAT');
    // 40 immediates run in one check phase, each a callback of its own: as an HTTP server's requests read in one turn.
    const spread = await Promise.all(
      Array.from({ length: 40 }, (_, i) => new Promise<boolean>((resolve, reject) => setImmediate(() => bucket.take(`s${i}`).then((d) => resolve(d.allowed), reject)))),
    );
    expect(spread.every(Boolean)).toBe(true);
    expect(await scriptCommands()).toBe(1);
    await admin.config('RESETSTAT');
    // 40 takes in one callback (as 40 workers woken by one socket read): the server starts on every 8 while the rest
    // are made.
    const burst = await Promise.all(Array.from({ length: 40 }, (_, i) => bucket.take(`b${i}`)));
    expect(burst.every((d) => d.allowed && d.remaining === 9)).toBe(true);
    expect(await scriptCommands()).toBe(5);
    client.disconnect();
  });

  it('runs a bucket reset after the takes made before it, though the takes wait for the end of the turn', async () => {
    const client = await connected();
    const prefix = uniquePrefix('reset-order');
    const bucket = new TokenBucket({ capacity: 2, rate: '1/min', redis: client, prefix });
    expect((await bucket.take('k', 2)).allowed).toBe(true);
    // A second bucket object: no remembered denial, so its take goes to Redis.
    const fresh = new TokenBucket({ capacity: 2, rate: '1/min', redis: client, prefix });
    const take = fresh.take('k');
    const reset = fresh.reset('k');
    expect((await take).allowed).toBe(false);
    await reset;
    // Reset last, as called: the bucket is full again.
    expect((await fresh.take('k', 2)).allowed).toBe(true);
    client.disconnect();
  });

  it('merges takes from separate callbacks of one event-loop turn (as an HTTP server makes them), and sends a release at the end of its own callback', async () => {
    const client = await connected();
    const prefix = uniquePrefix('turn');
    const bucket = new TokenBucket({ capacity: 5, rate: '1/min', redis: client, prefix });
    const locks = new RedisLock(client, { prefix });
    await bucket.take('warm');
    const held = await locks.acquire('r');
    await admin.config('RESETSTAT');
    // Eight immediates queued together run in one check phase, each a callback of its own (8: one full command).
    const takes = await new Promise<Promise<unknown>[]>((resolve) => {
      const out: Promise<unknown>[] = [];
      for (let i = 0; i < 8; i++) {
        setImmediate(() => {
          out.push(bucket.take(`k${i % 2}`));
          if (out.length === 8) resolve(out);
        });
      }
    });
    const decisions = (await Promise.all(takes)) as { allowed: boolean }[];
    expect(decisions.every((d) => d.allowed)).toBe(true);
    expect(await scriptCommands()).toBe(1);
    // A release is not held for the turn: a command from a later callback of the same turn finds it done.
    const seen = await new Promise<number>((resolve, reject) => {
      setImmediate(() => void held.release());
      setImmediate(() => client.exists(lockNames(prefix, 'r').lock).then(resolve, reject));
    });
    expect(seen).toBe(0);
    locks.close();
    client.disconnect();
  });

  it('runs merged calls in the order they were made, and an error fails its own call only', async () => {
    const client = await connected();
    const prefix = uniquePrefix('order');
    const one = new RedisLock(client, { prefix });
    const two = new RedisLock(client, { prefix });
    await (await one.acquire('warm')).release();
    // A key of the wrong type makes that call's script fail inside the merged command.
    await admin.hset(lockNames(prefix, 'bad').lock, 'x', '1');
    await admin.config('RESETSTAT');
    const firstOne = one.tryAcquire('a');
    const firstTwo = two.tryAcquire('b');
    const bad = rejection(one.tryAcquire('bad'));
    const thenTwo = two.tryAcquire('a');
    const thenOne = one.tryAcquire('b');
    const [a, b, error, a2, b2] = await Promise.all([firstOne, firstTwo, bad, thenTwo, thenOne]);
    // One command for all five, run in call order: the first caller of each key holds it, the second is refused. The
    // failed call then sends its token's release (a script that failed midway may have taken the lock), which can run
    // before or after a stats read sent at the same time: counted once it has run, as the second script command.
    await until(async () => (await scriptCommands()) >= 2, 3_000, "the failed call's release");
    expect(await scriptCommands()).toBe(2);
    expect(a).not.toBeNull();
    expect(b).not.toBeNull();
    expect(a2).toBeNull();
    expect(b2).toBeNull();
    expect(error).toBeInstanceOf(LockUnavailableError);
    expect((error as Error).message).toMatch(/WRONGTYPE/);
    // A release and an acquire of the same key in one turn: the release runs first, so the acquire gets the key.
    const released = a!.release();
    const again = two.tryAcquire('a');
    expect(await released).toBe(true);
    const next = await again;
    expect(next).not.toBeNull();
    expect(next!.fence).toBeGreaterThan(a!.fence);
    // A command the app sends on the same client from a later callback runs after the call made before it.
    const later = one.tryAcquire('c');
    const seen = await new Promise<number>((resolve, reject) => {
      setImmediate(() => client.exists(lockNames(prefix, 'c').lock).then(resolve, reject));
    });
    expect(seen).toBe(1);
    await Promise.all([next!.release(), b!.release(), (await later)!.release()]);
    one.close();
    two.close();
    client.disconnect();
  });

  it('sends a merged command as EVAL when the server lost its script, and still answers every call', async () => {
    const client = await connected();
    const prefix = uniquePrefix('merge-flush');
    const locks = new RedisLock(client, { prefix });
    await Promise.all((await Promise.all([locks.acquire('w1'), locks.acquire('w2')])).map((l) => l.release()));
    await admin.script('FLUSH');
    await admin.config('RESETSTAT');
    const leases = await Promise.all(Array.from({ length: 6 }, (_, i) => locks.acquire(`k${i}`)));
    expect(await ownReplies(prefix, leases)).toBe(true);
    // EVALSHA of the merged script failed with NOSCRIPT once, then one EVAL carried all six calls.
    expect(await commandStats('evalsha')).toEqual({ calls: 1, failed: 1 });
    expect((await commandStats('eval')).calls).toBe(1);
    expect((await Promise.all(leases.map((l) => l.release()))).every(Boolean)).toBe(true);
    locks.close();
    client.disconnect();
  });

  it("sends a script's first call on a connection as EVAL, later ones as EVALSHA, and recovers from a flushed cache", async () => {
    await admin.script('FLUSH');
    await admin.config('RESETSTAT');
    const client = await connected();
    const locks = new RedisLock(client, { prefix: uniquePrefix('eval') });
    const first = await locks.acquire('a');
    expect(await first.release()).toBe(true);
    // One EVAL per script (acquire, release), no NOSCRIPT on the way.
    expect(await commandStats('eval')).toEqual({ calls: 2, failed: 0 });
    expect(await commandStats('evalsha')).toEqual({ calls: 0, failed: 0 });
    const second = await locks.acquire('a');
    expect(second.fence).toBeGreaterThan(first.fence);
    expect(await second.release()).toBe(true);
    expect(await commandStats('evalsha')).toEqual({ calls: 2, failed: 0 });
    // The server forgets the scripts on the same connection: EVALSHA fails with NOSCRIPT once, then EVAL; and every
    // other script's next call goes as EVAL at once (the release), without a NOSCRIPT of its own.
    await admin.script('FLUSH');
    const third = await locks.acquire('a');
    expect(third.fence).toBeGreaterThan(second.fence);
    expect(await third.release()).toBe(true);
    expect(await commandStats('eval')).toMatchObject({ calls: 4 });
    expect(await commandStats('evalsha')).toEqual({ calls: 3, failed: 1 });
    locks.close();
    client.disconnect();
  });

  it("names the script by its SHA, not its text (up to 11 KB), in the reply error a failing EVAL leaves as the cause", async () => {
    const prefix = uniquePrefix('eval-cause');
    const bucket = { capacity: 1, rate: 1 };
    // Keys holding a hash: each script fails where it reads them.
    await admin.hset(bucketKey(bucket, prefix, 'k'), 'x', '1');
    await admin.hset(lockNames(prefix, 'k').lock, 'x', '1');
    const calls: [string, (c: Redis) => Promise<unknown>][] = [
      ['take', (c) => new TokenBucket({ ...bucket, redis: c, prefix }).take('k')],
      ['acquire', (c) => new RedisLock(c, { prefix }).acquire('k')],
    ];
    for (const [what, call] of calls) {
      const client = await connected();
      // The first call on this connection, so an EVAL.
      const error = await rejection(call(client));
      const command = (error as { cause?: { command?: { name?: string; args?: unknown[] } } }).cause?.command;
      expect([what, command?.name, command?.args?.[0]]).toEqual([what, 'eval', expect.stringMatching(/^<hasp script [0-9a-f]{40}>$/)]);
      expect(inspect(error, { depth: Infinity }).length).toBeLessThan(3_000);
      client.disconnect();
    }
  });

  it('sends EVAL again after reconnecting to a restarted server, without a NOSCRIPT round trip', async () => {
    const own = await startRedis();
    const client = own.client();
    await client.ping();
    const locks = new RedisLock(client, { prefix: uniquePrefix('restart') });
    await (await locks.acquire('a')).release();
    await own.restart();
    await within(
      new Promise<void>((resolve) => (client.status === 'ready' ? resolve() : client.once('ready', () => resolve()))),
      5_000,
      'the client to reconnect',
    );
    const probe = own.client();
    const lease = await locks.acquire('a');
    expect(await lease.release()).toBe(true);
    const info = await probe.info('commandstats');
    expect(/cmdstat_evalsha:/.exec(info)).toBeNull();
    expect(/cmdstat_eval:calls=2,/.exec(info)).not.toBeNull();
    locks.close();
    await own.stop();
  });

  it('fails a batch of 50 calls on a frozen server within the timeout, each timeout on its own clock', async () => {
    const own = await startRedis();
    const client = own.client();
    await client.ping();
    const slow = new RedisLock(client, { prefix: uniquePrefix('frozen'), timeout: 1_500 });
    const fast = new RedisLock(client, { prefix: uniquePrefix('frozen'), timeout: 200 });
    // Warm both scripts, so the frozen calls are plain EVALSHA.
    await (await slow.acquire('warm')).release();
    own.pause();
    try {
      const started = performance.now();
      const slowCalls = Array.from({ length: 50 }, (_, i) =>
        rejection(slow.tryAcquire(`s${i}`)).then((e) => [e, performance.now() - started] as const),
      );
      const fastCalls = Array.from({ length: 50 }, (_, i) =>
        rejection(fast.tryAcquire(`f${i}`)).then((e) => [e, performance.now() - started] as const),
      );
      // The short timeout is not held up by the long one started before it.
      for (const [error, took] of await within(Promise.all(fastCalls), 3_000, 'the 200 ms calls')) {
        expect(error).toBeInstanceOf(LockUnavailableError);
        expect(took).toBeGreaterThanOrEqual(195);
        expect(took).toBeLessThan(1_000);
      }
      for (const [error, took] of await within(Promise.all(slowCalls), 5_000, 'the 1500 ms calls')) {
        expect(error).toBeInstanceOf(LockUnavailableError);
        expect(took).toBeGreaterThanOrEqual(1_495);
        expect(took).toBeLessThan(2_500);
      }
    } finally {
      own.resume();
    }
    // The acquires that land after thawing are handed back instead of holding their keys for the ttl.
    const probe = own.client();
    await until(
      async () => (await probe.keys('*')).every((k) => k.endsWith(':f')),
      5_000,
      'the late acquires to be handed back',
      20,
    );
    slow.close();
    fast.close();
    await own.stop();
  });

  it('writes together on every Redlock node too: 60 Redlock acquires on 3 nodes in a few reads per node (unbatched: 20 or more)', async () => {
    const a = await startRedis();
    const b = await startRedis();
    const clients = [node.client(), a.client(), b.client()];
    await Promise.all(clients.map((c) => c.ping()));
    const locks = new Redlock(clients, { prefix: uniquePrefix('rl-batch') });
    await (await locks.acquire('warm')).release();
    const probes = [admin, a.client(), b.client()];
    const readsOn = async (c: Redis) => Number(/total_reads_processed:(\d+)/.exec(await c.info('stats'))![1]);
    const before = await Promise.all(probes.map(readsOn));
    const leases: Lease[] = await Promise.all(Array.from({ length: 60 }, (_, i) => locks.acquire(`k${i}`)));
    const after = await Promise.all(probes.map(readsOn));
    for (let i = 0; i < 3; i++) expect(after[i]! - before[i]!).toBeLessThanOrEqual(6);
    expect((await Promise.all(leases.map((l) => l.release()))).every(Boolean)).toBe(true);
    locks.close();
    for (const c of clients) c.disconnect();
    await a.stop();
    await b.stop();
  });

  it('publishes a release only when a waiter of another process is queued, and then wakes it at once', async () => {
    const prefix = uniquePrefix('publish');
    const pair = twoLockers(prefix);
    const { ours: locks, theirs } = pair;
    await (await locks.acquire('warm')).release();
    await (await theirs.acquire('warm')).release();
    await admin.config('RESETSTAT');
    for (let i = 0; i < 20; i++) expect(await (await locks.acquire('k')).release()).toBe(true);
    expect((await commandStats('publish')).calls).toBe(0);
    const held = await locks.acquire('k');
    const waiter = theirs.acquire('k', { wait: 10_000 });
    // The waiter is in line (and so listening: it queues before it subscribes, and subscribes before it sleeps).
    await queued(prefix, 'k', 1, 'the waiter to queue');
    const released = performance.now();
    await held.release();
    const next = await within(waiter, 2_000, 'the waiter');
    // Woken by the release, not by its 1 s poll.
    expect(performance.now() - released).toBeLessThan(500);
    expect(next.fence).toBeGreaterThan(held.fence);
    expect((await commandStats('publish')).calls).toBe(1);
    await next.release();
    pair.close();
  });

  it('wakes waiters on lazyConnect clients too (their subscriber copy would otherwise never connect)', async () => {
    const clients = [node.client({ lazyConnect: true }), node.client({ lazyConnect: true })];
    const prefix = uniquePrefix('lazy');
    const [ours, theirs] = clients.map((c) => new RedisLock(c, { prefix })) as [RedisLock, RedisLock];
    try {
      const held = await ours.acquire('k');
      const waiter = theirs.acquire('k', { wait: 10_000 });
      await queued(prefix, 'k', 1, 'the waiter to queue');
      // It queues, then subscribes: wait until the server counts the subscription, so the release below is heard (or,
      // as before the fix, never made, and the waiter only finds out at its 1 s poll).
      await until(async () => Number(((await admin.pubsub('NUMSUB', lockNames(prefix, 'k').channel)) as [string, number])[1]) > 0, 2_000, 'the waiter to subscribe');
      const released = performance.now();
      await held.release();
      const next = await within(waiter, 3_000, 'the waiter');
      expect(performance.now() - released).toBeLessThan(500);
      await next.release();
    } finally {
      ours.close();
      theirs.close();
      for (const c of clients) c.disconnect();
    }
  });

  it('works on clients with ioredis stringNumbers, which answer numbers as strings', async () => {
    const client = node.client({ stringNumbers: true });
    const prefix = uniquePrefix('strings');
    const locks = new RedisLock(client, { prefix });
    const redlock = new Redlock([client], { prefix: `${prefix}rl:` });
    const bucket = new TokenBucket({ capacity: 2, rate: '1/min', redis: client, prefix });
    try {
      const lease = await locks.tryAcquire('k');
      expect(lease).not.toBeNull();
      expect(typeof lease!.fence).toBe('number');
      expect(await locks.tryAcquire('k')).toBeNull();
      await lease!.extend(60_000);
      expect(lease!.expiresAt).toBeGreaterThan(Date.now() + 30_000);
      expect(await lease!.release()).toBe(true);
      expect(await admin.exists(lockNames(prefix, 'k').lock)).toBe(0);
      const rl = await redlock.tryAcquire('k');
      expect(rl).not.toBeNull();
      expect(await rl!.release()).toBe(true);
      const takes = await Promise.all([bucket.take('b'), bucket.take('b'), bucket.take('b')]);
      expect(takes.map((d) => [d.allowed, d.remaining])).toEqual([
        [true, 1],
        [true, 0],
        [false, 0],
      ]);
      expect(takes[2]!.retryAfter).toBeGreaterThan(0);
    } finally {
      locks.close();
      redlock.close();
      client.disconnect();
    }
  });

  it('works on clients with an ioredis keyPrefix: every key carries it, and a release still wakes a waiter at once', async () => {
    const keyPrefix = uniquePrefix('kp');
    const clients = [node.client({ keyPrefix }), node.client({ keyPrefix })];
    const [ours, theirs] = clients.map((c) => new RedisLock(c)) as [RedisLock, RedisLock];
    const bucket = new TokenBucket({ capacity: 1, rate: '1/min', redis: clients[0]! });
    const held = await ours.acquire('k');
    const waiter = theirs.acquire('k', { wait: 10_000 });
    await until(async () => (await admin.zcard(keyPrefix + lockNames('hasp:lock:', 'k').queue)) === 1, 2_000, 'the waiter to queue');
    const released = performance.now();
    await held.release();
    const next = await within(waiter, 2_000, 'the waiter');
    // Woken by the release (published on the prefixed name), not by its 1 s poll.
    expect(performance.now() - released).toBeLessThan(500);
    expect(next.fence).toBeGreaterThan(held.fence);
    // Two takes in one callback travel merged (the take's batch form): ioredis prefixes each of their keys too.
    const takes = await Promise.all([bucket.take('b'), bucket.take('c')]);
    expect(takes.map((d) => d.allowed)).toEqual([true, true]);
    expect((await admin.keys(`${keyPrefix}*`)).sort()).toEqual(
      [
        `${keyPrefix}hasp:lock:{k}`,
        `${keyPrefix}hasp:lock:{k}:f`,
        keyPrefix + bucketKey(bucket, 'hasp:tb:', 'b'),
        keyPrefix + bucketKey(bucket, 'hasp:tb:', 'c'),
      ].sort(),
    );
    await next.release();
    ours.close();
    theirs.close();
    for (const c of clients) c.disconnect();
  });

  it('hands a released lock straight to a waiter of the same locker that is first in line: one call, no wake-up', async () => {
    const client = node.client();
    const prefix = uniquePrefix('handoff');
    const names = lockNames(prefix, 'k');
    const locks = new RedisLock(client, { prefix, ttl: 20_000 });
    const held = await locks.acquire('k');
    const waiter = locks.acquire('k', { wait: 10_000, owner: 'job-2' });
    await queued(prefix, 'k', 1, 'the waiter to queue');
    await admin.config('RESETSTAT');
    const before = Date.now();
    expect(await held.release()).toBe(true);
    const next = await within(waiter, 2_000, 'the waiter');
    const after = Date.now();
    // The release did it all: no PUBLISH, no attempt of the waiter's own.
    expect(await scriptCommands()).toBe(1);
    expect((await commandStats('publish')).calls).toBe(0);
    expect(next.fence).toBeGreaterThan(held.fence);
    // The lease counts from before the release was sent, less the drift.
    expect(next.expiresAt).toBeGreaterThanOrEqual(before + 20_000 - 2 - Math.ceil(20_000 * 0.01) - 1);
    expect(next.expiresAt).toBeLessThanOrEqual(after + 20_000);
    expect(await admin.pttl(names.lock)).toBeGreaterThan(19_000);
    expect(await admin.zcard(names.queue)).toBe(0);
    // It holds it as its owner: the same owner re-enters, anyone else is refused.
    const nested = await locks.tryAcquire('k', { owner: 'job-2' });
    expect(nested?.fence).toBe(next.fence);
    expect(await locks.tryAcquire('k')).toBeNull();
    expect(await nested!.release()).toBe(true);
    expect(await next.release()).toBe(true);
    expect(await admin.exists(names.lock)).toBe(0);
    locks.close();
    client.disconnect();
  });

  it('hands the lock to the first in line even when a waiter of the releasing locker is behind it', async () => {
    const prefix = uniquePrefix('order');
    const pair = twoLockers(prefix);
    const { ours: locks, theirs } = pair;
    const held = await locks.acquire('k');
    const remote = theirs.acquire('k', { wait: 10_000 });
    await queued(prefix, 'k', 1, 'the remote waiter to queue');
    let localDone = false;
    const local = locks.acquire('k', { wait: 10_000 });
    void local.then(() => (localDone = true));
    await queued(prefix, 'k', 2, 'the local waiter to queue');
    await held.release();
    const first = await within(remote, 2_000, 'the remote waiter');
    expect(localDone).toBe(false);
    expect(await first.release()).toBe(true);
    const second = await within(local, 2_000, 'the local waiter');
    expect(second.fence).toBeGreaterThan(first.fence);
    expect(await second.release()).toBe(true);
    pair.close();
  });

  it('never strands a lock handed to a waiter that gives up at the same moment', async () => {
    const prefix = uniquePrefix('giveup');
    const names = lockNames(prefix, 'k');
    const pair = twoLockers(prefix, { ttl: 30_000 });
    const { ours: locks, theirs } = pair;
    for (let i = 0; i < 24; i++) {
      const held = await locks.acquire('k');
      const stop = new AbortController();
      // Its outcome is taken at once: an abort settles the acquire at once, while this test still awaits the release.
      const waiter = locks.acquire('k', { wait: 10_000, signal: stop.signal }).then(
        (l) => l,
        (e: unknown) => e,
      );
      await queued(prefix, 'k', 1, 'the waiter to queue');
      // The abort lands before, with, or after the release's hand-off.
      const release = held.release();
      if (i % 3 === 0) stop.abort();
      else if (i % 3 === 1) void Promise.resolve().then(() => stop.abort());
      else setImmediate(() => stop.abort());
      expect(await release).toBe(true);
      const outcome = await within(waiter, 2_000, 'the waiter to settle');
      if (outcome instanceof Error) {
        // It gave up: the lock is free for anyone at once, not after its 30 s ttl.
        const next = await within(theirs.acquire('k', { wait: 2_000 }), 3_000, 'another process');
        expect(await next.release()).toBe(true);
      } else {
        expect(await (outcome as Lease).release()).toBe(true);
      }
      await until(async () => (await admin.exists(names.lock)) === 0, 2_000, 'the lock to be free');
    }
    pair.close();
  });

  it('lets a waiter of the releasing locker that is first in line in at once, before Redis answers, and keeps it on once Redis has recorded it', async () => {
    const t = await pausableLock('hand-over');
    const { own, probe, names, locks } = t;
    try {
      const held = await locks.acquire('k');
      const waiter = locks.acquire('k', { wait: 10_000 });
      // Its first wait on this key: it tries, subscribes, and tries again. Both refusals (which tell it that it is
      // first in line) have been read.
      await t.scriptsRun(3);
      expect(await probe.zcard(names.queue)).toBe(1);
      let next: Lease;
      own.pause();
      try {
        const releasedAt = Date.now();
        const released = held.release();
        // Redis answers nothing now: the waiter gets the lock all the same.
        next = await within(waiter, 1_000, 'the waiter, with Redis paused');
        expect(next.fence).toBe(held.fence + 1);
        // Until Redis has recorded the hand-over, the new lease runs on the released one, which still holds it there.
        expect(next.expiresAt).toBeLessThanOrEqual(held.expiresAt);
        expect(next.expiresAt).toBeGreaterThan(releasedAt + 10_000);
        expect(next.signal.aborted).toBe(false);
        // The release does not wait past its timeout for Redis: for the releasing holder the lock has passed on.
        expect(await within(released, 2_000, 'the release')).toBe(true);
      } finally {
        own.resume();
      }
      // Redis records it once it runs again (the reply comes after the timeout): the lease gets its own 20 s.
      await t.expectRecorded(next, held);
    } finally {
      await t.close();
    }
  });

  it("lets its waiter in at once while that waiter's own attempt is unanswered, and the attempt's timeout does not fail it", async () => {
    // A 5 s timeout: the waiter must get the lock long before its attempt would time out.
    const t = await pausableLock('hand-over-in-flight', 5_000);
    const { own, proxy, locks } = t;
    const unhandled = trackUnhandled();
    try {
      const held = await locks.acquire('k');
      const waiter = locks.acquire('k', { wait: 30_000 });
      await t.scriptsRun(3);
      let next: Lease;
      own.pause();
      try {
        // With Redis paused no wake-up gets through: the waiter's next attempt is its poll, within a second.
        await within(proxy.sent('evalsha'), 3_000, "the waiter's next attempt");
        const released = held.release();
        next = await within(waiter, 2_500, 'the waiter, its attempt unanswered');
        expect(next.fence).toBe(held.fence + 1);
        expect(next.signal.aborted).toBe(false);
        // The release and the attempt both time out now (5 s); the lease is the waiter's all the same.
        expect(await within(released, 8_000, 'the release')).toBe(true);
      } finally {
        own.resume();
      }
      // Redis refuses the late attempt (the releasing lease still held the lock then), then records the hand-over.
      await t.expectRecorded(next, held);
      expect(unhandled.reasons).toEqual([]);
    } finally {
      unhandled.stop();
      await t.close();
    }
  });

  it('passes the lock down a line of its own waiters with Redis paused, and Redis then records every hand-over in order', async () => {
    const t = await pausableLock('hand-over-line');
    const { own, probe, names, locks } = t;
    try {
      const held = await locks.acquire('k');
      const waiters: Promise<Lease>[] = [];
      for (let i = 1; i <= 4; i++) {
        waiters.push(locks.acquire('k', { wait: 10_000 }));
        // The first tries, subscribes and tries again; the others, on a key waited on lately, subscribe first and try once.
        await t.scriptsRun(2 + i);
      }
      expect(await probe.zcard(names.queue)).toBe(4);
      const leases: Lease[] = [];
      // Released one after the other at once.
      const releases: Promise<boolean>[] = [];
      own.pause();
      try {
        let previous: Lease = held;
        for (const [i, waiter] of waiters.entries()) {
          releases.push(previous.release());
          const next = await within(waiter, 1_000, `waiter ${i + 1}, with Redis paused`);
          expect(next.fence).toBe(held.fence + i + 1);
          leases.push(next);
          previous = next;
        }
      } finally {
        own.resume();
      }
      expect(await within(Promise.all(releases), 3_000, 'the releases')).toEqual([true, true, true, true]);
      expect(leases.map((l) => l.signal.aborted)).toEqual([true, true, true, false]);
      await t.expectRecorded(leases[3]!, held);
    } finally {
      await t.close();
    }
  });

  it('lets its own waiters in at once only up to a waiter of another process in the line, which goes next', async () => {
    const prefix = uniquePrefix('hand-over-mixed');
    const pair = twoLockers(prefix);
    const { ours, theirs } = pair;
    const order: string[] = [];
    const held = await ours.acquire('k');
    const line = [
      ['ours 1', ours],
      ['theirs', theirs],
      ['ours 2', ours],
    ] as const;
    const waiting = new Map<string, Promise<Lease>>();
    for (const [i, [name, locker]] of line.entries()) {
      waiting.set(name, locker.acquire('k', { wait: 10_000 }).then((l) => (order.push(name), l)));
      await queued(prefix, 'k', i + 1, `${name} to queue`);
    }
    await held.release();
    for (const name of ['ours 1', 'theirs', 'ours 2']) {
      const lease = await within(waiting.get(name)!, 3_000, name);
      expect(order).toEqual(['ours 1', 'theirs', 'ours 2'].slice(0, order.length));
      expect(await lease.release()).toBe(true);
    }
    expect(order).toEqual(['ours 1', 'theirs', 'ours 2']);
    pair.close();
  });

  it.each([
    ['its lock is gone from Redis', 'gone'],
    ['the fence key has moved past the next fence', 'fence'],
  ] as const)(
    'takes back the lock it let a waiter in to when the releasing lease turns out not to cover the hand-over (%s)',
    async (_, fault) => {
      const client = node.client();
      const prefix = uniquePrefix(`hand-over-${fault}`);
      const names = lockNames(prefix, 'k');
      const events: LockErrorEvent[] = [];
      const locks = new RedisLock(client, { prefix, ttl: 20_000, onError: (e) => events.push(e) });
      const held = await locks.acquire('k');
      const refusals = refusalCounter(locks);
      const waiter = locks.acquire('k', { wait: 10_000 });
      await queued(prefix, 'k', 1, 'the waiter to queue');
      // (Its attempt once subscribed would otherwise find the lock gone below, and take it from Redis.)
      await refusals.settled('k', 'the waiter', admin, names.channel);
      await client.ping();
      // What this process cannot see: the lease expired there (a stall), or a fence was made elsewhere.
      if (fault === 'gone') await admin.del(names.lock);
      else await admin.set(names.fence, String(held.fence + 5), 'KEEPTTL');
      const released = held.release();
      const next = await within(waiter, 1_000, 'the waiter');
      expect(next.fence).toBe(held.fence + 1);
      expect(await abortReason(next.signal, 2_000, 'the new lease to be lost')).toBeInstanceOf(LockLostError);
      // Whether the released lease still held the lock there.
      expect(await released).toBe(fault === 'fence');
      expect(events).toEqual([expect.objectContaining({ operation: 'lost', key: 'k' })]);
      expect(await admin.exists(names.lock)).toBe(0);
      expect(await admin.zcard(names.queue)).toBe(0);
      // Free for anyone at once, with a fence above every one handed out.
      const after = await locks.tryAcquire('k');
      expect(after).not.toBeNull();
      expect(after!.fence).toBeGreaterThan(held.fence + 5);
      expect(await next.release()).toBe(false);
      expect(await after!.release()).toBe(true);
      locks.close();
      client.disconnect();
    },
  );

  it('hands out a fence above a stored fence that is ahead of the server clock', async () => {
    const prefix = uniquePrefix('ahead');
    const locks = new RedisLock(admin, { prefix });
    const ahead = 9_000_000_000_000_000;
    await admin.set(lockNames(prefix, 'k').fence, String(ahead), 'PX', 60_000);
    const first = await locks.acquire('k');
    expect(first.fence).toBe(ahead + 1);
    await first.release();
    const second = await locks.acquire('k');
    expect(second.fence).toBe(ahead + 2);
    expect(await admin.get(lockNames(prefix, 'k').fence)).toBe(String(ahead + 2));
    await second.release();
    locks.close();
  });

  /** A RedisLock with a 5 s ttl on a fresh prefix, its key `k`'s fence key, and the server clock in µs. */
  const fenceCase = (name: string) => {
    const prefix = uniquePrefix(name);
    const ttl = 5_000;
    const micros = async (): Promise<number> => {
      const [s, us] = await admin.time();
      return Number(s) * 1_000_000 + Number(us);
    };
    return { prefix, ttl, locks: new RedisLock(admin, { prefix, ttl }), fenceKey: lockNames(prefix, 'k').fence, micros };
  };

  it('takes fences from the server clock, above a fence key that is stale or gone (a failover that lost the last writes)', async () => {
    const { prefix, ttl, locks, fenceKey, micros } = fenceCase('clock');
    const before = await micros();
    const first = await locks.acquire('k');
    const after = await micros();
    expect(first.fence).toBeGreaterThanOrEqual(before);
    expect(first.fence).toBeLessThanOrEqual(after);
    // The fence key lives at least ttl + retention (FENCE_RETENTION_MS) from the latest lease.
    const created = await admin.pttl(fenceKey);
    expect(created).toBeGreaterThan(FENCE_RETENTION_MS + ttl);
    expect(created).toBeLessThanOrEqual(FENCE_RETENTION_MS + ttl + FENCE_RENEW_US / 1_000);
    // A refused attempt leaves the fence key alone.
    const other = new RedisLock(admin, { prefix });
    await expect(other.acquire('k')).rejects.toBeInstanceOf(LockBusyError);
    other.close();
    expect(await admin.get(fenceKey)).toBe(String(first.fence));
    await first.release();
    const between = await micros();
    const second = await locks.acquire('k');
    expect(second.fence).toBeGreaterThan(first.fence);
    expect(second.fence).toBeGreaterThanOrEqual(between);
    await second.release();
    // A promoted replica may hold an older fence than the last one its master handed out (replication is
    // asynchronous). A counter would go on from there and hand out a fence already used; the clock is past it.
    for (const stale of [String(first.fence), null]) {
      const held = await locks.acquire('k');
      const last = held.fence;
      await held.release();
      if (stale === null) await admin.del(fenceKey);
      else await admin.set(fenceKey, stale, 'PX', FENCE_RETENTION_MS + ttl);
      const next = await locks.acquire('k');
      expect(next.fence).toBeGreaterThan(last);
      expect(await admin.get(fenceKey)).toBe(String(next.fence));
      expect(await admin.pttl(fenceKey)).toBeGreaterThan(FENCE_RETENTION_MS);
      await next.release();
    }
    locks.close();
  });

  it('renews a fence key’s expiry when the fence enters a new minute, and keeps it within the minute', async () => {
    const { ttl, locks, fenceKey, micros } = fenceCase('renew');
    // Not in a minute's last second, so the lease below lands in the same minute as the fence stored first.
    const late = async () => (await micros()) % FENCE_RENEW_US > FENCE_RENEW_US - 1_000_000;
    if (await late()) await until(async () => !(await late()), 2_000, 'the next minute');
    const stored = (await micros()) - 1;
    const minute = stored - (stored % FENCE_RENEW_US);
    // A fence earlier in the same minute: the lease keeps the expiry it finds.
    await admin.set(fenceKey, String(stored), 'PX', 600_000);
    const same = await locks.acquire('k');
    expect(same.fence).toBeGreaterThan(stored);
    expect(same.fence).toBeLessThan(minute + FENCE_RENEW_US);
    const kept = await admin.pttl(fenceKey);
    expect(kept).toBeLessThanOrEqual(600_000);
    expect(kept).toBeGreaterThan(500_000);
    await same.release();
    // A fence from the minute before: renewed.
    await admin.set(fenceKey, String(minute - 1), 'PX', 600_000);
    const next = await locks.acquire('k');
    expect(next.fence).toBeGreaterThan(minute);
    expect(await admin.pttl(fenceKey)).toBeGreaterThan(FENCE_RETENTION_MS + ttl);
    await next.release();
    locks.close();
  });

  it('gives each Redlock attempt a fence floor of its own, so quick cycles on one key never take the slower fence path', async () => {
    const locks = new Redlock([node.client()], { prefix: uniquePrefix('floor') });
    await (await locks.acquire('k')).release();
    await admin.config('RESETSTAT');
    // Cycles far shorter than the millisecond the floor's clock counts in: a repeated floor would not be above the
    // stored fence, and the script would write the fence and the lock once more each time.
    const fences: number[] = [];
    for (let i = 0; i < 30; i++) {
      const lease = await locks.acquire('k');
      fences.push(lease.fence);
      await lease.release();
    }
    expect(fences).toEqual([...fences].sort((x, y) => x - y));
    expect(new Set(fences).size).toBe(30);
    // Per acquire: SET NX for the lock and SET … KEEPTTL GET for the fence.
    expect((await statsOf(admin, 'set')).calls).toBe(60);
    locks.close();
  });

  it('lets a waiter on a key waited on lately listen first: one refused attempt, then woken by the release', async () => {
    const prefix = uniquePrefix('hot');
    // The holders are another process, so the waiters are woken (a release in their own locker hands over directly).
    const pair = twoLockers(prefix);
    const { ours: locks, theirs: holders } = pair;
    const first = await holders.acquire('k');
    // A cold key: attempt, subscribe, attempt again.
    const second = locks.acquire('k', { wait: 10_000 });
    await queued(prefix, 'k', 1, 'the queue');
    await first.release();
    await (await second).release();
    const held = await holders.acquire('k');
    // Now the key is hot: the next waiter listens before its attempt and sends only that one before sleeping.
    await admin.config('RESETSTAT');
    const third = locks.acquire('k', { wait: 10_000 });
    await queued(prefix, 'k', 1, 'the queue');
    expect((await commandStats('evalsha')).calls).toBe(1);
    const released = performance.now();
    await held.release();
    const last = await within(third, 2_000, 'the hot waiter');
    expect(performance.now() - released).toBeLessThan(500);
    expect(last.fence).toBeGreaterThan(held.fence);
    // Its attempt, the release, its attempt once woken.
    expect((await commandStats('evalsha')).calls).toBe(3);
    await last.release();
    pair.close();
  });

  it('fails its calls on a client inside the app’s own MULTI (answered QUEUED), and an acquire run at EXEC is handed back', async () => {
    const client = await connected();
    const prefix = uniquePrefix('multi');
    const locks = new RedisLock(client, { prefix });
    const bucket = new TokenBucket({ capacity: 1, rate: '1/h', redis: client, prefix });
    const unhandled = trackUnhandled();
    try {
      // Warm: every call below goes as EVALSHA, merged or alone.
      await (await locks.acquire('warm')).release();
      await bucket.take('warm');
      await client.multi({ pipeline: false });
      const calls = [rejection(locks.tryAcquire('k')), rejection(bucket.take('t')), rejection(bucket.take('t2'))];
      const [lockError, ...takeErrors] = await within(Promise.all(calls), 3_000, 'the calls inside MULTI');
      expect(lockError).toBeInstanceOf(LockUnavailableError);
      expect(String((lockError as Error).message)).toMatch(/inside a MULTI/);
      for (const e of takeErrors) expect(e).toBeInstanceOf(RateLimitUnavailableError);
      // Run at EXEC: the acquire, then the release hasp queued behind it.
      await client.exec();
      expect(await client.exists(lockNames(prefix, 'k').lock)).toBe(0);
      await new Promise((resolve) => setImmediate(resolve));
      expect(unhandled.reasons).toEqual([]);
    } finally {
      unhandled.stop();
      locks.close();
      client.disconnect();
    }
  });

  it('fails a batch in flight when the server dies, then works again on the same client after a restart', async () => {
    const own = await startRedis();
    const client = own.client();
    await client.ping();
    const locks = new RedisLock(client, { prefix: uniquePrefix('killed'), timeout: 1_000 });
    await (await locks.acquire('warm')).release();
    const started = performance.now();
    const calls = Array.from({ length: 50 }, (_, i) =>
      locks.acquire(`k${i}`, { ttl: 30_000 }).then(
        () => 'lease' as const,
        (error: unknown) => error,
      ),
    );
    await own.kill();
    // Killed before or after its reply was read, every call either failed on time or got a lease: none hangs.
    const outcomes = await within(Promise.all(calls), 3_000, 'the calls in flight');
    expect(performance.now() - started).toBeLessThan(2_500);
    for (const error of outcomes) if (error !== 'lease') expect(error).toBeInstanceOf(LockUnavailableError);
    await own.restart();
    await within(
      new Promise<void>((resolve) => (client.status === 'ready' ? resolve() : client.once('ready', () => resolve()))),
      5_000,
      'the client to reconnect',
    );
    const lease = await locks.acquire('after');
    expect(await lease.release()).toBe(true);
    locks.close();
    await own.stop();
  });

  // TRANSFER only records a hand-over its releasing holder made: it must never put the heir over a lock someone else
  // holds (the releaser's key expired and another process took it before the record arrived), and never hand out a
  // fence the fence key already holds. Both were unguarded (review 52's mutants survived the suite).
  describe('TRANSFER, called directly', () => {
    async function held(label: string) {
      const prefix = uniquePrefix(label);
      const locks = new RedisLock(admin, { prefix });
      const lease = await locks.acquire('k', { ttl: 10_000 });
      const n = lockNames(prefix, 'k');
      return { locks, lease, keys: [n.lock, n.queue, n.deadlines, n.fence], lockKey: n.lock, fenceKey: n.fence };
    }

    it("leaves another holder's lock alone: 0, and the key still names that holder", async () => {
      const { locks, lease, keys, lockKey } = await held('transfer-other');
      const reply = await TRANSFER.run(admin, keys, ['a-lease-that-ended', 'heir-token', String(lease.fence + 1), 10_000, '']);
      expect(reply).toBe(0);
      expect(String(await admin.get(lockKey)).startsWith(`${lease.token} `)).toBe(true);
      expect(await lease.release()).toBe(true);
      locks.close();
    });

    it('refuses a fence equal to the stored one: -1, and the lock is freed rather than handed over', async () => {
      const { locks, lease, keys, lockKey, fenceKey } = await held('transfer-fence');
      const stored = String(await admin.get(fenceKey));
      expect(Number(stored)).toBe(lease.fence);
      const reply = await TRANSFER.run(admin, keys, [lease.token, 'heir-token', stored, 10_000, '']);
      expect(reply).toBe(-1);
      expect(await admin.get(lockKey)).toBeNull();
      expect(await admin.get(fenceKey)).toBe(stored);
      locks.close();
    });
  });
});
