// Attacks on Redlock's fence monotonicity: nodes that store different fences, consecutive leases granted by different
// majorities, late nodes, and random minorities paused or killed (restarted from their append-only file) in between.
import type { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { Lease, Redlock, RedlockOptions } from '../../packages/core/src/index.js';
import { lockNames } from '../../packages/core/src/lock/redis-store.js';
import { startRedisNodes, stopAll } from '../harness/redis.js';
import { abortReason, until } from '../core/helpers.js';
import { firstNonIncreasing, freshPrefix, Nodes, trackUnhandled } from './support.js';

// Persistence (every write fsynced before the reply) lets a killed node come back at once with its locks and fences:
// one of the two restart disciplines Redlock allows (the other: restart empty only after the ttl).
const PERSISTENT = ['--appendonly', 'yes', '--appendfsync', 'always'];

let nodes: Nodes;
const made: { locker: Redlock; clients: Redis[] }[] = [];
const unhandled = trackUnhandled();

beforeAll(async () => {
  nodes = new Nodes(await startRedisNodes(5, { args: PERSISTENT }));
});

afterAll(async () => {
  unhandled.stop();
  nodes?.close();
  await stopAll();
});

afterEach(async () => {
  for (const m of made.splice(0)) {
    m.locker.close();
    for (const c of m.clients) c.disconnect();
  }
  await nodes.heal();
  expect(unhandled.reasons).toEqual([]);
});

function redlock(options: RedlockOptions): { locker: Redlock; clients: Redis[] } {
  const m = nodes.redlock(options);
  made.push(m);
  return m;
}

/** Fences far ahead of the clock floor (µs since the epoch), so only the stored values can make a fence large. */
const AHEAD = Date.now() * 1_000 + 10 ** 12;

describe('Redlock fences', () => {
  it('grow when the next lease is granted by a different majority that shares one node with the last', async () => {
    const prefix = freshPrefix('fence-majorities');
    const fenceKey = lockNames(prefix, 'k').fence;
    const a = redlock({ prefix });
    const b = redlock({ prefix });
    // Node 0 alone remembers a large fence (say, from leases the others missed).
    await nodes.admins[0]!.set(fenceKey, String(AHEAD));

    await nodes.kill([3, 4], [a.clients, b.clients]);
    const first = await a.locker.acquire('k', { ttl: 10_000 });
    expect(await nodes.holders(prefix, 'k')).toEqual([0, 1, 2]);
    expect(first.fence).toBe(AHEAD + 1);
    // The agreed fence was written back to the whole granting majority before the lease was handed out.
    for (const i of [0, 1, 2]) {
      expect(await nodes.fenceOn(i, prefix, 'k')).toBe(first.fence);
      expect((await nodes.lockOn(i, prefix, 'k'))!.f).toBe(String(first.fence));
    }
    expect(await first.release()).toBe(true);

    // The next majority {2, 3, 4} shares only node 2 with the first; 3 and 4 never saw a fence for this key.
    await nodes.restart([3, 4], [a.clients, b.clients]);
    await nodes.kill([0, 1], [a.clients, b.clients]);
    const second = await b.locker.acquire('k', { ttl: 10_000 });
    expect(await nodes.holders(prefix, 'k')).toEqual([2, 3, 4]);
    expect(second.fence).toBeGreaterThan(first.fence);
    expect(await second.release()).toBe(true);

    // And back to a majority that includes the nodes that missed the second lease.
    await nodes.restart([0, 1], [a.clients, b.clients]);
    await nodes.kill([2, 4], [a.clients, b.clients]);
    const third = await a.locker.acquire('k', { ttl: 10_000 });
    expect(third.fence).toBeGreaterThan(second.fence);
    expect(await third.release()).toBe(true);
  });

  it('give a late node of the lease the agreed fence, so a nested acquire reports the lease’s fence', async () => {
    const prefix = freshPrefix('fence-late');
    const a = redlock({ prefix });
    const b = redlock({ prefix });
    await (await a.locker.acquire('warm-up')).release();
    await nodes.admins[4]!.set(lockNames(prefix, 'k').fence, String(AHEAD));

    nodes.pause([4]);
    const outer = await a.locker.acquire('k', { owner: 'w', ttl: 10_000 });
    expect(outer.fence).toBeLessThan(AHEAD);
    nodes.resume([4]);
    // Node 4 grants the queued acquire with its own, larger proposal; the locker overwrites it with the lease's fence.
    await until(async () => (await nodes.lockOn(4, prefix, 'k'))?.f === String(outer.fence), 2_000, 'node 4 to get the agreed fence', 10);
    const nested = await b.locker.acquire('k', { owner: 'w' });
    expect(nested.token).toBe(outer.token);
    expect(nested.fence).toBe(outer.fence);
    expect(await nested.release()).toBe(true);
    expect(await outer.release()).toBe(true);
    const next = await b.locker.acquire('k');
    expect(next.fence).toBeGreaterThan(outer.fence);
    await next.release();
  });

  it('grow strictly over leases on random majorities of nodes holding different fences, released or expired', async () => {
    const prefix = freshPrefix('fence-random');
    const fenceKey = lockNames(prefix, 'k').fence;
    // Rounds settle at the quorum, without waiting for the paused nodes: a node timeout above the default 100 ms
    // only keeps a machine under load (every node once answered late) from failing a round.
    const lockers = [0, 1, 2].map(() => redlock({ prefix, nodeTimeout: 500 }));
    const clients = lockers.map((l) => l.clients);
    // Every node starts from a different stored fence. Nodes 1, 3 and 4 (a majority, as a previous lease would have
    // left them) are far ahead of the clock.
    const seeds = [0, AHEAD - 5, 1_000_000, AHEAD, AHEAD + 7];
    await Promise.all(seeds.map((f, i) => (f > 0 ? nodes.admins[i]!.set(fenceKey, String(f)) : undefined)));

    const ROUNDS = 40;
    const fences: number[] = [];
    let kills = 0;
    let pauses = 0;
    const started = performance.now();
    for (let round = 0; round < ROUNDS && performance.now() - started < 20_000; round++) {
      // A random minority (0-2 nodes) is down for this lease: paused, or killed and restarted from its AOF.
      const down = shuffle([0, 1, 2, 3, 4]).slice(0, round % 3);
      const kill = round % 5 === 4 && down.length > 0;
      if (kill) {
        await nodes.kill(down, clients);
        kills += down.length;
      } else {
        nodes.pause(down);
        pauses += down.length;
      }
      const { locker } = lockers[round % lockers.length]!;
      const lease: Lease = await locker.acquire('k', { ttl: round % 4 === 3 ? 150 : 5_000, wait: 3_000 });
      fences.push(lease.fence);
      if (round % 4 === 3) await abortReason(lease.signal, 3_000, 'the short lease to expire');
      else expect(await lease.release()).toBe(true);
      if (kill) await nodes.restart(down, clients);
      else nodes.resume(down);
    }
    expect(fences.length).toBeGreaterThanOrEqual(20);
    expect(firstNonIncreasing(fences)).toBe(-1);
    // Every quorum meets that majority: stored fences, not clocks, decided.
    expect(fences[0]).toBeGreaterThan(AHEAD - 5);
    console.log(`fences: ${fences.length} leases on random majorities, ${pauses} node pauses, ${kills} node kills`);
  });
});

function shuffle<T>(xs: T[]): T[] {
  for (let i = xs.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [xs[i], xs[j]] = [xs[j]!, xs[i]!];
  }
  return xs;
}
