// Hostile keys on Redlock: whatever the key, every node only gets names and channels under the prefix, and a key shaped
// like another key's internal name never touches that key's lock or fence on any node.
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Lease } from '../../packages/core/src/index.js';
import { lockNames } from '../../packages/core/src/lock/redis-store.js';
import { startRedisNodes, stopAll } from '../harness/redis.js';
import { HOSTILE_KEYS } from '../core/fixtures.js';
import { until } from '../core/helpers.js';
import { freshPrefix, Nodes, trackUnhandled } from './support.js';

let nodes: Nodes;
const made: { close(): void; clients: Redis[] }[] = [];
const unhandled = trackUnhandled();

beforeAll(async () => {
  nodes = new Nodes(await startRedisNodes(5));
});

afterAll(async () => {
  for (const m of made) {
    m.close();
    for (const c of m.clients) c.disconnect();
  }
  unhandled.stop();
  nodes?.close();
  await stopAll();
  expect(unhandled.reasons).toEqual([]);
});

function redlock(prefix: string) {
  const m = nodes.redlock({ prefix });
  made.push({ close: () => m.locker.close(), clients: m.clients });
  return m.locker;
}

describe('Redlock keys', () => {
  it('writes only names and channels under its prefix on every node, whatever the key', async () => {
    await Promise.all(nodes.nodes.map((n) => n.flush()));
    const prefix = freshPrefix('hostile');
    const a = redlock(prefix);
    const b = redlock(prefix);
    const held: { lease: Lease; waiter: Promise<Lease> }[] = [];
    const leases: Lease[] = [];
    for (const key of HOSTILE_KEYS) {
      const lease = await a.acquire(key, { ttl: 10_000 });
      expect(lease.key).toBe(key);
      leases.push(lease);
    }
    // Each key has its lock and its fence on each node, nothing else. An acquire settles at the quorum, so the other
    // nodes' grants may still be on their way: the waiters start once every node has them (a waiter's attempt that
    // overtook a late grant would take that node, and leave it free after its undo).
    const namesOnEveryNode = (perKey: number, what: string) =>
      until(
        async () => (await Promise.all(nodes.admins.map((a) => a.dbsize()))).every((n) => n === HOSTILE_KEYS.length * perKey),
        5_000,
        what,
      );
    await namesOnEveryNode(2, 'every key’s lock and fence on every node');
    for (const lease of leases) {
      // A waiter subscribes to the key's wake-up channel on every node.
      const waiter = b.acquire(lease.key, { wait: 10_000, ttl: 10_000 });
      waiter.catch(() => undefined);
      held.push({ lease, waiter });
    }
    const channels = (i: number) => nodes.admins[i]!.pubsub('CHANNELS') as Promise<string[]>;
    await until(
      async () => (await Promise.all([0, 1, 2, 3, 4].map(channels))).every((c) => c.length >= HOSTILE_KEYS.length),
      10_000,
      'every waiter to subscribe on every node',
    );
    // Refused waiters queue: each key's line (names and places, heartbeat deadlines) on every node, and nothing else.
    await namesOnEveryNode(4, 'every key’s lock, fence and line on every node');
    for (let i = 0; i < 5; i++) {
      const names = await nodes.admins[i]!.keys('*');
      for (const name of names) expect(name.startsWith(prefix), name.slice(0, 80)).toBe(true);
      for (const channel of await channels(i)) expect(channel.startsWith(prefix), channel.slice(0, 80)).toBe(true);
    }
    // Every key is held, by exactly its own lease: the waiters are all still waiting.
    for (const key of HOSTILE_KEYS) expect(await b.tryAcquire(key), JSON.stringify(key.slice(0, 20))).toBeNull();
    for (const { lease, waiter } of held) {
      expect(await lease.release()).toBe(true);
      const next = await waiter;
      expect(next.fence).toBeGreaterThan(lease.fence);
      expect(await next.release()).toBe(true);
    }
  });

  it('keeps keys shaped like another key’s internal names away from its lock and fence on every node', async () => {
    const prefix = freshPrefix('forged');
    const locks = redlock(prefix);
    const a = await locks.acquire('a', { ttl: 10_000 });
    const names = lockNames(prefix, 'a');
    await until(async () => (await nodes.holders(prefix, 'a')).length === 5, 2_000, 'the lock on every node');
    const before = await Promise.all(
      nodes.admins.map(async (admin) => [await admin.get(names.lock), await admin.get(names.fence)] as const),
    );
    const forged: Lease[] = [];
    for (const key of ['a}:f', 'a}', 'a:f', '{a}', 'a}:q', 'a}:d', 'a}:w']) forged.push(await locks.acquire(key, { ttl: 10_000 }));
    const after = await Promise.all(
      nodes.admins.map(async (admin) => [await admin.get(names.lock), await admin.get(names.fence)] as const),
    );
    expect(after).toEqual(before);
    for (const lease of forged) expect(await lease.release()).toBe(true);
    expect(await a.release()).toBe(true);
    const again = await locks.acquire('a');
    expect(again.fence).toBeGreaterThan(a.fence);
    await again.release();
  });
});
