// RedisLock, Redlock and TokenBucket on a real 3-master Redis Cluster: the Locker contract, hash slots of every name,
// wake-ups across nodes, bucket limits under concurrency, and a Redlock whose members mix a Cluster and single nodes.
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { Cluster, Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  LockBusyError,
  RedisLock,
  Redlock,
  TokenBucket,
  type Lease,
  type Locker,
} from '../../packages/core/src/index.js';
import { RateLimiter } from '../../packages/core/src/http/rate-limiter.js';
import { lockNames } from '../../packages/core/src/lock/redis-store.js';
import { hashSlot, keyStem } from '../../packages/core/src/redis/keys.js';
import { startCluster, startRedisNodes, stopAll, type RedisCluster, type RedisNode } from '../harness/redis.js';
import { lockContract } from '../core/lock-contract.js';
import { expectInvalid, uniquePrefix, until, within } from '../core/helpers.js';
import { firstNonIncreasing, notReady, trackUnhandled } from '../redlock/support.js';
import { clusterLockFixture } from './fixtures.js';
import { keysPerMaster, masters, ownerOf, slotOf, startMigration, subscribers } from './support.js';

let cluster: RedisCluster;
let singles: RedisNode[];

beforeAll(async () => {
  [cluster, singles] = await Promise.all([startCluster(), startRedisNodes(2)]);
});

afterAll(async () => {
  await stopAll();
});

lockContract('RedisLock on a 3-master Cluster', clusterLockFixture(() => cluster));

/** Runs `body` with a fresh Cluster client, disconnected afterwards. */
async function withClient<T>(body: (client: Cluster) => Promise<T>): Promise<T> {
  const client = cluster.client();
  try {
    return await body(client);
  } finally {
    client.disconnect();
  }
}

describe('hash slots on a Cluster', () => {
  const tricky = ['{', '}', '{}', '}{', '{{}}', 'a{b}c', '{a}', '%7D', '%', '\uD800', 'x\uDC00', 'line\nbreak', '\0'];

  it('puts every Redis name of a key in one slot whatever the key, spreads keys over every master, and runs every script there', async () => {
    await withClient(async (client) => {
      const prefix = uniquePrefix('slots');
      const bucketPrefix = uniquePrefix('slots-tb');
      const keys = [...tricky, ...Array.from({ length: 60 }, (_, i) => `user:${i}`)];
      const view = await masters(client);
      const slots = new Set<number>();
      const owners = new Set<number>();
      for (const key of keys) {
        const names = Object.values(lockNames(prefix, key));
        const keySlots = await Promise.all(names.map((n) => slotOf(client, n)));
        expect(new Set(keySlots).size, `names of ${JSON.stringify(key)}: ${names.join(' ')}`).toBe(1);
        slots.add(keySlots[0]!);
        owners.add(ownerOf(view, keySlots[0]!));
      }
      // 73 keys over 16384 slots: a handful of collisions at most, and all three masters in use.
      expect(slots.size).toBeGreaterThan(keys.length - 5);
      expect(owners.size).toBe(3);

      const locks = new RedisLock(client, { prefix });
      const other = new RedisLock(cluster.client(), { prefix });
      const bucket = new TokenBucket({ capacity: 2, rate: 1, redis: client, prefix: bucketPrefix });
      try {
        await Promise.all(
          keys.map(async (key) => {
            const lease = await locks.acquire(key, { ttl: 10_000 });
            expect(await other.tryAcquire(key)).toBeNull();
            // A timed-out waiter joins and then leaves the queue: the four-key acquire and leave scripts.
            await expect(other.acquire(key, { wait: 30 })).rejects.toBeInstanceOf(LockBusyError);
            await lease.extend(20_000);
            expect(await lease.release()).toBe(true);
            const next = await other.acquire(key, { wait: 1_000 });
            expect(next.fence).toBeGreaterThan(lease.fence);
            expect(await next.release()).toBe(true);

            expect((await bucket.take(key, 2)).allowed).toBe(true);
            expect((await bucket.peek(key)).allowed).toBe(false);
            expect((await bucket.take(key)).allowed).toBe(false);
            await bucket.reset(key);
            expect((await bucket.take(key, 2)).allowed).toBe(true);
          }),
        );
      } finally {
        locks.close();
        other.close();
      }
    });
  });

  it('computes the hash slot of a name as the server does (the rate limiter uses it for its circuit per master)', async () => {
    await withClient(async (client) => {
      const names = ['', 'a', 'hasp:tb:p:{user:1}:3kx9a', '{}', '{}x', 'x{}y{z}', '{a}{b}', 'a{b', 'a}b{c}', 'é{ü€😀}', '😀', '\u0000{\n}'];
      for (let i = 0; i < 50; i++) names.push(`k:${i}:${'x'.repeat(i)}`);
      const expected = await Promise.all(names.map((n) => slotOf(client, n)));
      expect(names.map(hashSlot)).toEqual(expected);
    });
  });

  it("keeps one slot per key with a '}' in the prefix, and refuses a prefix holding '{'", async () => {
    await withClient(async (client) => {
      for (const prefix of ['app}', 'a}b:', '}']) {
        const locks = new RedisLock(client, { prefix });
        try {
          for (const key of ['k', '{', '}', 'a{b}c']) {
            const names = Object.values(lockNames(prefix, key));
            const keySlots = new Set(await Promise.all(names.map((n) => slotOf(client, n))));
            expect(keySlots.size, `prefix ${prefix} key ${key}`).toBe(1);
            const lease = await locks.acquire(key, { wait: 100 });
            expect(await lease.release()).toBe(true);
          }
        } finally {
          locks.close();
        }
      }
      // 'x{}' hashed each name whole (an empty tag): CROSSSLOT on every script. '{x}' pinned all keys to one slot. A lone
      // '{' kept the slots but let names collide: key '{k' under 'app' and key 'k' under 'app{' were both 'app{{k}'.
      for (const prefix of ['x{}', 'app{x}:', '{tenant}:', 'a{b}{c}', 'app{', 'a}b{', '{']) {
        await expectInvalid(() => new RedisLock(client, { prefix }), 'prefix');
        await expectInvalid(() => new Redlock([client], { prefix }), 'prefix');
        // A bucket has one name per key, so a tag would only crowd every bucket into one slot; refused all the same.
        await expectInvalid(() => new TokenBucket({ capacity: 1, rate: 1, redis: client, prefix }), 'prefix');
      }
    });
  });
});

describe('scripts on a Cluster', () => {
  /** NOSCRIPT replies the masters have given, summed. */
  async function noScriptErrors(admins: readonly Redis[]): Promise<number> {
    let total = 0;
    for (const a of admins) total += Number(/errorstat_NOSCRIPT:count=(\d+)/.exec(await a.info('errorstats'))?.[1] ?? 0);
    return total;
  }

  it('sends a script as EVAL the first time on each master, so no call meets NOSCRIPT and comes back after later ones', async () => {
    const admins = cluster.nodes.map((n) => n.client());
    const noScript = () => noScriptErrors(admins);
    try {
      // No master knows hasp's scripts: what a new Cluster, or one restarted, looks like to a new client.
      await Promise.all(admins.map((a) => a.script('FLUSH').catch(() => undefined)));
      const before = await noScript();
      await withClient(async (client) => {
        const prefix = uniquePrefix('scripts');
        const locks = new RedisLock(client, { prefix });
        try {
          const perMaster = await keysPerMaster(client, 'script', (key) => lockNames(prefix, key).lock);
          // One master at a time: each call of the script after the first one goes to a master that has not run it.
          for (const [key] of perMaster.values()) await (await locks.acquire(key!)).release();
        } finally {
          locks.close();
        }
      });
      expect(await noScript()).toBe(before);
    } finally {
      for (const a of admins) a.disconnect();
    }
  });

  it('counts a script as known on the master that ran it when a stale slot map sent it to another one first', async () => {
    const admins = cluster.nodes.map((n) => n.client());
    /** NOSCRIPT replies one run met on its own client, after a slot moved behind its back. */
    const run = async (attempt: number): Promise<number> => {
      let met = 0;
      let moveBack: (() => Promise<void>) | undefined;
      await Promise.all(admins.map((a) => a.script('FLUSH').catch(() => undefined)));
      try {
        await withClient(async (client) => {
          const evalsha = client.evalsha.bind(client);
          client.evalsha = ((...args: Parameters<typeof evalsha>) =>
            evalsha(...args).catch((error: unknown) => {
              if (error instanceof Error && error.message.startsWith('NOSCRIPT')) met++;
              throw error;
            })) as typeof client.evalsha;
          const prefix = uniquePrefix(`stale-map-${attempt}`);
          const locks = new RedisLock(client, { prefix });
          try {
            const view = await masters(client);
            const perMaster = await keysPerMaster(client, 'stale', (key) => lockNames(prefix, key).lock, 2);
            const [[fromPort, [moved, stayed]], [toPort]] = [...perMaster.entries()] as [[number, string[]], [number]];
            const slot = await slotOf(client, lockNames(prefix, moved!).lock);
            const stayedSlot = await slotOf(client, lockNames(prefix, stayed!).lock);
            expect(stayedSlot).not.toBe(slot);
            // The slot moves behind the client's back: its map still sends the first call there to the old master,
            // which answers MOVED, and the call runs on the new one.
            await (await startMigration(view, slot, view.find((m) => m.port === toPort)!)).finish();
            // Every node (replicas too, which learn it over the cluster bus) sees the move before the client asks: a
            // refresh of the client's map from one that did not yet would put the old master back in it.
            await until(
              async () => (await Promise.all(admins.map(async (a) => ownerOf(await masters(a), slot)))).every((p) => p === toPort),
              5_000,
              'every node to see the move',
            );
            const to = view.find((m) => m.port === fromPort)!;
            moveBack = async () => (await startMigration(await masters(admins[0]!), slot, to)).finish();
            expect((client as unknown as { slots: string[][] }).slots[slot]?.[0]).toMatch(new RegExp(`:${fromPort}$`));
            await (await locks.acquire(moved!)).release();
            // ioredis answers MOVED by writing the new master into the slot's entry of its map, an array it shares
            // with every slot of the range: until its refresh lands, the map sends the old master's other slots to the
            // new one too (which answers MOVED, and that costs a NOSCRIPT: the limitation the READMEs state).
            const slots = (client as unknown as { slots: string[][] }).slots;
            await until(() => slots[stayedSlot]?.[0]?.endsWith(`:${fromPort}`) === true, 5_000, 'the client’s map to be refreshed');
            // The old master never ran the scripts: the next call there must not count on it having done so.
            await (await locks.acquire(stayed!)).release();
            await (await locks.acquire(moved!)).release();
          } finally {
            locks.close();
          }
        });
      } finally {
        await moveBack?.();
      }
      return met;
    };
    try {
      expect(await run(0)).toBe(0);
    } finally {
      for (const a of admins) a.disconnect();
    }
  });
});

describe('the HTTP rate limiter on a Cluster', () => {
  it('takes a policy name with braces (it goes into the bucket prefix) and limits per key', async () => {
    await withClient(async (client) => {
      const policy = `login{v2}:${uniquePrefix('policy')}`;
      const limiter = new RateLimiter<string>(
        { capacity: 2, rate: '1/min', redis: client, policy, key: (k) => k, onStoreError: 'closed' },
        () => undefined,
      );
      for (const key of ['a', 'b{c}']) {
        expect((await limiter.check(key))?.allowed).toBe(true);
        expect((await limiter.check(key))?.allowed).toBe(true);
        expect((await limiter.check(key))?.allowed).toBe(false);
      }
    });
  });
});

describe('wake-ups on a Cluster', () => {
  it('hands a key on every master to its waiter within 250 ms of the release, well before the 1 s poll', async () => {
    const clients = [cluster.client(), cluster.client()];
    const prefix = uniquePrefix('wake');
    const [holders, waiters] = clients.map((c) => new RedisLock(c, { prefix })) as [RedisLock, RedisLock];
    try {
      // The waiters' one subscriber connection sits on one node; keys on the other two masters need PUBLISH to
      // travel over the cluster bus.
      const perMaster = await keysPerMaster(clients[0]!, 'wake', (k) => lockNames(prefix, k).lock, 2);
      const latencies: number[] = [];
      for (const key of [...perMaster.values()].flat()) {
        const holder = await holders.acquire(key, { ttl: 30_000 });
        const pending = waiters.acquire(key, { wait: 10_000, ttl: 30_000 });
        pending.catch(() => undefined); // awaited below
        const names = lockNames(prefix, key);
        await until(
          async () => (await subscribers(clients[0]!, names.channel)) > 0 && (await clients[0]!.zcard(names.queue)) > 0,
          5_000,
          `the waiter on ${key} to queue and subscribe`,
        );
        const releasedAt = performance.now();
        expect(await holder.release()).toBe(true);
        const lease = await within(pending, 10_000, `the waiting acquire of ${key}`);
        latencies.push(performance.now() - releasedAt);
        expect(lease.fence).toBeGreaterThan(holder.fence);
        await lease.release();
      }
      expect(latencies.length).toBe(6);
      expect(Math.max(...latencies), `hand-off latencies ${latencies.map(Math.round).join(', ')} ms`).toBeLessThan(250);
    } finally {
      holders.close();
      waiters.close();
      for (const c of clients) c.disconnect();
    }
  });
});

describe('hand-offs within a process on a Cluster', () => {
  it('go through Redis (its redirections can reorder commands): the waiter’s fence comes from the server clock, not the released one + 1', async () => {
    await withClient(async (client) => {
      const prefix = uniquePrefix('cluster-hand-off');
      const locks = new RedisLock(client, { prefix, ttl: 20_000 });
      try {
        for (const key of [...(await keysPerMaster(client, 'hand-off', (k) => lockNames(prefix, k).lock)).values()].flat()) {
          const held = await locks.acquire(key);
          const waiter = locks.acquire(key, { wait: 10_000 });
          await until(async () => (await client.zcard(lockNames(prefix, key).queue)) === 1, 5_000, `the waiter on ${key} to queue`);
          // Its refusal (which says it is first in line) has been read by now.
          await client.get(lockNames(prefix, key).lock);
          expect(await held.release()).toBe(true);
          const next = await within(waiter, 5_000, `the waiter on ${key}`);
          // Let in at once, it would have the released fence + 1; handed over by Redis, the clock (µs) is far past that.
          expect(next.fence).toBeGreaterThan(held.fence + 1);
          expect(await next.release()).toBe(true);
        }
      } finally {
        locks.close();
      }
    });
  });
});

describe('ioredis keyPrefix on a Cluster', () => {
  it('puts the keyPrefix in front of every name, and a release still wakes a waiter at once', async () => {
    const keyPrefix = uniquePrefix('kp');
    const clients = [cluster.client({ keyPrefix }), cluster.client({ keyPrefix })];
    const [holders, waiters] = clients.map((c) => new RedisLock(c)) as [RedisLock, RedisLock];
    try {
      const names = lockNames('hasp:lock:', 'k');
      const holder = await holders.acquire('k', { ttl: 30_000 });
      const pending = waiters.acquire('k', { wait: 10_000, ttl: 30_000 });
      pending.catch(() => undefined); // awaited below
      // The lock's names carry the prefix (ioredis adds it to every key of ours; zcard here goes through it too).
      await until(
        async () => (await subscribers(clients[0]!, keyPrefix + names.channel)) > 0 && (await clients[0]!.zcard(names.queue)) > 0,
        5_000,
        'the waiter to queue and subscribe',
      );
      await withClient(async (plain) => expect(await plain.exists(keyPrefix + names.lock)).toBe(1));
      const releasedAt = performance.now();
      expect(await holder.release()).toBe(true);
      const lease = await within(pending, 10_000, 'the waiting acquire');
      expect(performance.now() - releasedAt).toBeLessThan(250);
      expect(lease.fence).toBeGreaterThan(holder.fence);
      await lease.release();
    } finally {
      holders.close();
      waiters.close();
      for (const c of clients) c.disconnect();
    }
  });
});

describe('TokenBucket on a Cluster', () => {
  it('never admits more than capacity + rate × elapsed per key, with 3 clients × 3 takers on keys of every master', async () => {
    const prefix = uniquePrefix('tb');
    const capacity = 5;
    const rate = 4;
    const clients = [cluster.client(), cluster.client(), cluster.client()];
    const buckets = clients.map((redis) => new TokenBucket({ capacity, rate, redis, prefix }));
    const keys = [...(await keysPerMaster(clients[0]!, 'tb', (k) => keyStem(prefix, k), 2)).values()].flat();
    const allowed = new Map(keys.map((k) => [k, 0]));
    const unhandled = trackUnhandled();
    try {
      const started = performance.now();
      const runFor = 1_500;
      await Promise.all(
        buckets.flatMap((bucket) =>
          keys.flatMap((key) =>
            Array.from({ length: 3 }, async () => {
              // Bounded by count and by time.
              for (let i = 0; i < 300 && performance.now() - started < runFor; i++) {
                const d = await bucket.take(key);
                if (d.allowed) allowed.set(key, allowed.get(key)! + 1);
                await new Promise((resolve) => setTimeout(resolve, 5));
              }
            }),
          ),
        ),
      );
      const elapsed = (performance.now() - started) / 1_000;
      for (const [key, n] of allowed) {
        expect(n, `admissions on ${key} in ${elapsed.toFixed(2)} s`).toBeLessThanOrEqual(Math.floor(capacity + rate * elapsed));
        // Not starved either: the burst and most of the refill went through.
        expect(n).toBeGreaterThanOrEqual(capacity + Math.floor(rate * (elapsed - 0.5)));
      }
      expect(unhandled.reasons).toEqual([]);
    } finally {
      unhandled.stop();
      for (const c of clients) c.disconnect();
    }
  });
});

describe('Redlock over a Cluster and two single nodes', () => {
  const prefix = uniquePrefix('mixed');
  const owned: (Redis | Cluster)[] = [];
  const lockers: Redlock[] = [];
  /** A Redlock with its own connections: [Cluster, single 0, single 1]. */
  const redlock = (): { locker: Redlock; clients: [Cluster, Redis, Redis] } => {
    const clients: [Cluster, Redis, Redis] = [cluster.client(), singles[0]!.client(), singles[1]!.client()];
    owned.push(...clients);
    const locker = new Redlock(clients, { prefix });
    lockers.push(locker);
    return { locker, clients };
  };

  afterAll(() => {
    for (const l of lockers) l.close();
    for (const c of owned) c.disconnect();
  });

  /** 4 Redlocks × `rounds` critical sections with wait on `key`; asserts one holder at a time and rising fences. */
  async function contend(contenders: Locker[], key: string, rounds: number): Promise<number[]> {
    let inside = 0;
    let maxInside = 0;
    const fences: number[] = [];
    await Promise.all(
      contenders.map(async (locker) => {
        for (let i = 0; i < rounds; i++) {
          await locker.using(
            key,
            async (lease: Lease) => {
              inside++;
              maxInside = Math.max(maxInside, inside);
              fences.push(lease.fence);
              await new Promise((resolve) => setTimeout(resolve, 2));
              inside--;
            },
            { wait: 10_000, ttl: 3_000 },
          );
        }
      }),
    );
    expect(maxInside).toBe(1);
    expect(fences.length).toBe(contenders.length * rounds);
    expect(firstNonIncreasing(fences), `fences ${fences.join(', ')}`).toBe(-1);
    return fences;
  }

  it('grants one holder at a time with rising fences, on keys of every cluster master', async () => {
    const contenders = Array.from({ length: 4 }, () => redlock().locker);
    const keys = [...(await keysPerMaster(cluster.client(), 'mixed', (k) => lockNames(prefix, k).lock)).values()].flat();
    await within(
      Promise.all(keys.map((key) => contend(contenders, key, 4))),
      30_000,
      'contention on three keys',
    );
  });

  it('wakes a waiter promptly through the Cluster or the single nodes', async () => {
    const a = redlock();
    const b = redlock();
    const key = 'mixed-wake';
    const channel = lockNames(prefix, key).channel;
    const holder = await a.locker.acquire(key, { ttl: 30_000 });
    const pending = b.locker.acquire(key, { wait: 10_000 });
    pending.catch(() => undefined); // awaited below
    // Every member publishes the release: a waiter listening on any one of them hears it.
    await until(
      async () =>
        (await subscribers(a.clients[0], channel)) > 0 ||
        (await Promise.all([a.clients[1].pubsub('NUMSUB', channel), a.clients[2].pubsub('NUMSUB', channel)])).some(
          (r) => Number((r as [string, number])[1]) > 0,
        ),
      5_000,
      'the waiter to subscribe',
    );
    const releasedAt = performance.now();
    expect(await holder.release()).toBe(true);
    const lease = await within(pending, 10_000, 'the waiting acquire');
    expect(performance.now() - releasedAt).toBeLessThan(300);
    expect(lease.fence).toBeGreaterThan(holder.fence);
    await lease.release();
  });

  it('keeps working with a single node down: the Cluster and the other node are a quorum', async () => {
    const contenders = Array.from({ length: 3 }, () => redlock());
    const key = 'mixed-degraded';
    const before = await contend(
      contenders.map((c) => c.locker),
      key,
      2,
    );
    await singles[1]!.kill();
    await Promise.all(contenders.map((c) => notReady(c.clients[2])));
    const after = await within(
      contend(
        contenders.map((c) => c.locker),
        key,
        3,
      ),
      30_000,
      'contention with a node down',
    );
    expect(after[0]!).toBeGreaterThan(before.at(-1)!);
  });
});

/** How a child of exit-child.ts ended: ms from its "done" to its exit, or 'alive' when still running after the grace. */
interface ChildEnd {
  exitedAfter: number | 'alive';
  code: number | null;
  output: string;
}

/** Runs exit-child.ts against the shared cluster; kills it if it is still alive `graceMs` after printing "done". */
async function runExitChild(what: 'bucket' | 'lock', end: 'quit' | 'keep', graceMs: number): Promise<ChildEnd> {
  const file = fileURLToPath(new URL('./exit-child.ts', import.meta.url));
  const root = fileURLToPath(new URL('../..', import.meta.url));
  const ports = cluster.nodes.map((n) => n.port).join(',');
  const child = spawn(process.execPath, ['--import', 'tsx', file, ports, what, end], {
    cwd: root,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const done = new Promise<void>((resolve) => {
    const onData = (chunk: Buffer): void => {
      output += chunk.toString('utf8');
      if (output.includes('done\n')) resolve();
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString('utf8')));
  });
  try {
    await within(Promise.race([done, exited]), 20_000, `exit-child ${what} ${end} to finish its work`);
    if (!output.includes('done\n')) return { exitedAfter: 0, code: await exited, output };
    const doneAt = performance.now();
    const grace = new Promise<'alive'>((resolve) => setTimeout(() => resolve('alive'), graceMs));
    const first = await Promise.race([exited.then(() => performance.now() - doneAt), grace]);
    if (first === 'alive') child.kill('SIGKILL');
    return { exitedAfter: first, code: await exited, output };
  } finally {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  }
}

describe('process exit on a Cluster', () => {
  it('after client.quit(), nothing hasp started keeps the process alive: TokenBucket, and RedisLock with a waiter', async () => {
    const [bucket, lock, kept] = await Promise.all([
      runExitChild('bucket', 'quit', 5_000),
      runExitChild('lock', 'quit', 5_000),
      // Control: without quit() the Cluster's own connections keep the process alive, so the check above can fail.
      runExitChild('bucket', 'keep', 1_500),
    ]);
    expect(bucket.code, bucket.output).toBe(0);
    expect(bucket.exitedAfter).not.toBe('alive');
    expect(lock.code, lock.output).toBe(0);
    expect(lock.exitedAfter).not.toBe('alive');
    expect(kept.output).toContain('done');
    expect(kept.exitedAfter).toBe('alive');
  });
});
