// Redlock behaviour pinned after mutation testing (review 57) found it unguarded, each test checked to fail with its
// mutant: waiters of one process in one millisecond keep their order; a grant that ioredis re-sends after reconnecting,
// once its round was lost and the round's undo could not reach the node, is handed back rather than left for the ttl.
// (A release sent again for as long as a node stays unreachable: release-retry.test.ts.)
import { Redis } from 'ioredis';
import { describe, expect, it } from 'vitest';
import { startProxy } from '../harness/proxy.js';
import type { Redlock } from '../../packages/core/src/index.js';
import { lockNames } from '../../packages/core/src/lock/redis-store.js';
import { until, within } from '../core/helpers.js';
import { freshPrefix, notReady, privateNodes, ready, type Nodes } from './support.js';

const privateThree = privateNodes(3);

function inLineEverywhere(nodes: Nodes, prefix: string, key: string, n: number): Promise<void> {
  return until(
    async () => (await Promise.all([0, 1, 2].map((i) => nodes.admins[i]!.zcard(lockNames(prefix, key).queue)))).every((len) => len === n),
    5_000,
    `${n} waiter(s) in line everywhere`,
  );
}

describe('Redlock waiting line within one process', () => {
  // RS4: places stamped in the same millisecond must still be unique and rising, or same-ms waiters of one process
  // sort by their random names and get in out of order.
  it('lets waiters of one process that arrive in the same millisecond in in the order they called acquire', async () => {
    const nodes = privateThree();
    const prefix = freshPrefix('same-ms');
    const key = 'k';
    const holder = nodes.redlock({ prefix }).locker;
    const waiting = nodes.redlock({ prefix }).locker;
    // A clock that does not move (many waiters within one millisecond).
    const frozen = Date.now();
    (waiting as unknown as { store: { placeClock: () => number } }).store.placeClock = () => frozen;
    const held = await holder.acquire(key, { ttl: 10_000 });
    await until(async () => (await nodes.holders(prefix, key)).length === 3, 5_000, 'the lock everywhere');
    const order: number[] = [];
    const waiters: Promise<void>[] = [];
    for (let i = 0; i < 6; i++) {
      waiters.push(
        waiting.acquire(key, { ttl: 10_000, wait: 10_000 }).then(async (lease) => {
          order.push(i);
          await lease.release();
        }),
      );
      await inLineEverywhere(nodes, prefix, key, i + 1);
    }
    await held.release();
    await within(Promise.all(waiters), 8_000, 'every waiter');
    expect(order).toEqual([0, 1, 2, 3, 4, 5]);
  });
});

describe('Redlock late grants of a lost round', () => {
  // M2: a grant that lands after its round was decided (busy) and after the round's undo failed (the connection was
  // down) is handed back, not left on the node for the whole ttl.
  it('hands back a stray grant that ioredis re-sends after reconnecting, once the round was already lost', async () => {
    const nodes = privateThree();
    const prefix = freshPrefix('stray-resent');
    const key = 'k';
    const n = lockNames(prefix, key);
    const holder = nodes.redlock({ prefix }).locker;
    const proxy = await startProxy(nodes.nodes[2]!.port);
    // Reconnects only after 500 ms: the round's undo finds it down, the re-sent acquire comes later.
    const via = new Redis({ host: '127.0.0.1', port: proxy.port, retryStrategy: () => 500 });
    via.on('error', () => undefined);
    const clients = [nodes.nodes[0]!.client(), nodes.nodes[1]!.client(), via];
    const { Redlock } = await import('../../packages/core/src/index.js');
    const locker: Redlock = new Redlock(clients, { prefix, nodeTimeout: 2_000, timeout: 2_000 });
    try {
      await Promise.all(clients.map((c) => c.ping()));
      const held = await holder.acquire(key, { ttl: 30_000 });
      await until(async () => (await nodes.holders(prefix, key)).length === 3, 2_000, 'held everywhere');
      await nodes.admins[2]!.del(n.lock); // node 2 is free: it will grant the round
      // The acquire's first send to node 2 (an EVAL with the script's text) cuts that connection.
      proxy.cutWhenSent('Redlock names its waiter apart');
      nodes.pause([0, 1]);
      const attempt = locker.tryAcquire(key, { ttl: 30_000 });
      await notReady(via);
      nodes.resume([0, 1]);
      expect(await attempt).toBeNull(); // busy on nodes 0 and 1
      // ioredis re-sends the acquire to node 2 once it reconnects: it grants there, and must be handed back.
      await ready(via);
      await via.ping(); // behind the re-sent acquire
      await until(async () => (await nodes.admins[2]!.exists(n.lock)) === 0, 2_000, 'the stray grant on node 2 to be handed back');
      // And it stays free (a hand-back, not a grant still on its way).
      await via.ping();
      expect(await nodes.admins[2]!.exists(n.lock)).toBe(0);
      await held.release();
    } finally {
      nodes.resumeAll();
      locker.close();
      for (const c of clients) c.disconnect();
      await proxy.close();
    }
  });
});
