// The Redlock mutual-exclusion checker: 8 clients (each its own Redlock with its own 5 connections), plus 4 Redlocks
// sharing one set of 5 connections (so their calls travel merged, as lockers in one process do), run 1,000 critical
// sections on one key while a fault injector kills, pauses, restarts and resumes a minority of the 5 masters at random
// moments. At most one client may ever be inside, and fences must rise in the order the sections ran.
//
// Restart discipline (Redlock's assumption that no node loses a lock before its ttl): the masters run with an
// append-only file, so a killed master comes back at once with its locks and fences. Redis writes the AOF before it
// replies, and SIGKILL ends the process, not the machine: the kernel keeps what was written, so `appendfsync no`
// suffices here (spares the shared CI disk); production needs `appendfsync always` to survive power loss too.
// Restarting the masters empty instead, at once, breaks mutual exclusion; this checker can see it (in one of two
// mutation runs without the AOF it found two holders inside; quorum 2 of 5 is caught every time).
import type { Redis } from 'ioredis';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { LockBusyError, LockUnavailableError, Redlock, type Lease } from '../../packages/core/src/index.js';
import { startRedisNodes, stopAll, type RedisNode } from '../harness/redis.js';
import { firstNonIncreasing, freshPrefix, Nodes, trackUnhandled } from './support.js';

/** Clients on connections of their own. */
const CLIENTS = 8;
/** Further clients sharing one set of connections. */
const SHARING = 4;
const SECTIONS = 1_000;
/**
 * Wall-clock bound of the run; the test fails if the sections are not done by then. Typically 20-35 s on two busy
 * cores: under contention Redlock resolves split votes by random back-off, and faults make rounds fail and retry.
 */
const RUN_MS = 75_000;
const TTL = 3_000;
/** At most this many masters are killed or paused at once: a minority of 5. */
const MAX_DOWN = 2;

let nodes: Nodes;

beforeAll(async () => {
  nodes = new Nodes(await startRedisNodes(5, { args: ['--appendonly', 'yes', '--appendfsync', 'no'] }));
});

afterAll(async () => {
  nodes?.close();
  await stopAll();
});

const immediate = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));
const between = (lo: number, hi: number): number => lo + Math.floor(Math.random() * (hi - lo));

it('keeps at most one holder and rising fences through 1,000 sections of 12 clients while a minority of nodes is killed and paused', async () => {
  const unhandled = trackUnhandled();
  const prefix = freshPrefix('mutex');
  const made: { locker: Redlock; clients: Redis[] }[] = Array.from({ length: CLIENTS }, () => nodes.redlock({ prefix }));
  const shared = nodes.redlock({ prefix });
  made.push(shared);
  for (let i = 1; i < SHARING; i++) made.push({ locker: new Redlock(shared.clients, { prefix }), clients: [] });

  let inside = 0;
  let maxInside = 0;
  let overran = 0;
  const fences: number[] = [];
  const failed = { unavailable: 0, busy: 0, release: 0 };
  const started = performance.now();
  const deadline = started + RUN_MS;
  let running = true;

  const worker = async (locker: Redlock): Promise<void> => {
    while (fences.length < SECTIONS && performance.now() < deadline) {
      let lease: Lease;
      try {
        lease = await locker.acquire('account', { ttl: TTL, wait: 5_000 });
      } catch (error) {
        // With two masters down a third may be slow: an attempt can fail for want of a quorum, or time out waiting.
        if (error instanceof LockUnavailableError) failed.unavailable++;
        else if (error instanceof LockBusyError) failed.busy++;
        else throw error;
        continue;
      }
      inside++;
      maxInside = Math.max(maxInside, inside);
      fences.push(lease.fence);
      // Stay inside across timers, so an overlapping holder would get to run meanwhile: mostly a few ms, and now and
      // then long enough for the injector (told at once) to kill or freeze a node and bring it back under the holder.
      await immediate();
      if (Math.random() < 0.015) {
        longSections++;
        strike?.();
        await sleep(between(200, 600));
      } else {
        await sleep(between(1, 5));
      }
      // The exclusion claim covers a lease until its expiry: a section that outlived it would not count.
      if (Date.now() >= lease.expiresAt) overran++;
      inside--;
      await lease.release().catch(() => {
        failed.release++; // expires by its ttl
      });
    }
  };

  let longSections = 0;
  // Wakes the injector early: a long section just started.
  let strike: (() => void) | undefined;
  const down = new Set<number>();
  const faults = { kills: 0, restarts: 0, pauses: 0, resumes: 0, twoDown: 0 };
  const injector = async (): Promise<void> => {
    const recoveries: Promise<void>[] = [];
    while (running) {
      const struck = await new Promise<boolean>((resolve) => {
        const timer = setTimeout(() => resolve(false), between(50, 300));
        strike = () => {
          clearTimeout(timer);
          resolve(true);
        };
      });
      strike = undefined;
      if (!running || down.size >= MAX_DOWN) continue;
      // Under a long section the node comes back quickly, while the holder is still inside.
      const downFor = struck ? between(20, 150) : between(50, 800);
      const up = [0, 1, 2, 3, 4].filter((i) => !down.has(i));
      const i = up[Math.floor(Math.random() * up.length)]!;
      const node: RedisNode = nodes.nodes[i]!;
      down.add(i);
      if (down.size === MAX_DOWN) faults.twoDown++;
      if (Math.random() < 0.5) {
        await node.kill();
        faults.kills++;
        recoveries.push(
          (async () => {
            await sleep(downFor);
            await node.restart(); // from its append-only file: locks and fences intact
            faults.restarts++;
            down.delete(i);
          })(),
        );
      } else {
        node.pause();
        faults.pauses++;
        recoveries.push(
          (async () => {
            await sleep(downFor);
            node.resume();
            faults.resumes++;
            down.delete(i);
          })(),
        );
      }
    }
    await Promise.all(recoveries);
  };

  const injecting = injector();
  try {
    await Promise.all(made.map((m) => worker(m.locker)));
  } finally {
    running = false;
    await injecting;
    for (const m of made) {
      m.locker.close();
      for (const c of m.clients) c.disconnect();
    }
    unhandled.stop();
  }
  const seconds = (performance.now() - started) / 1_000;
  console.log(
    `mutual exclusion: ${fences.length} critical sections by ${CLIENTS} clients on their own connections and ` +
      `${SHARING} sharing one set, in ${seconds.toFixed(1)} s; ` +
      `faults: ${faults.kills} kills (${faults.restarts} restarts), ${faults.pauses} pauses, ` +
      `${faults.twoDown} times two masters down at once, ${longSections} long sections; ` +
      `failed acquires: ${failed.unavailable} no quorum, ${failed.busy} busy after wait; failed releases: ${failed.release}`,
  );

  expect(maxInside).toBe(1);
  expect(overran).toBe(0);
  expect(fences.length).toBeGreaterThanOrEqual(SECTIONS);
  expect(firstNonIncreasing(fences)).toBe(-1);
  expect(faults.kills + faults.pauses).toBeGreaterThanOrEqual(10);
  expect(unhandled.reasons).toEqual([]);
});
