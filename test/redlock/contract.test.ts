// Runs the shared Locker contract against Redlock over five private redis-server masters, and over fewer nodes with a
// quorum above a bare majority (2 of 2, 3 of 4, 3 of 3), where a busy key's round settles with nodes still unheard.
import type { Redis } from 'ioredis';
import { afterAll, beforeAll } from 'vitest';
import { Redlock, type LockerOptions } from '../../packages/core/src/index.js';
import { lockNames } from '../../packages/core/src/lock/redis-store.js';
import { startRedisNodes, stopAll, type RedisNode } from '../harness/redis.js';
import { lockContract, type LockerFixture, type MakeLocker } from '../core/lock-contract.js';
import { freshPrefix } from './support.js';

/** The parts of Redlock's store the fixture reads to see a waiter with its wake-up armed. */
/** A locker's share of its client's wake-ups (every locker here has connections of its own, so a share of its own). */
interface WakeupShareInternals {
  wakeups: { channels: Map<string, { listeners: Set<unknown>; ready: Promise<unknown> | undefined }> };
}

let nodes: RedisNode[];

beforeAll(async () => {
  nodes = await startRedisNodes(5);
});

afterAll(async () => {
  await stopAll();
});

/**
 * Redlock on the first `count` nodes (with `quorum`, when given): every locker gets its own connections and shares the
 * fixture's prefix.
 */
function redlockFixture(count: number, quorum?: number): MakeLocker {
  return async (options?: LockerOptions): Promise<LockerFixture> => {
    const prefix = freshPrefix('contract');
    const clients: Redis[] = [];
    const lockers: Redlock[] = [];
    const used = nodes.slice(0, count);
    const make = (): Redlock => {
      const own = used.map((n) => n.client());
      clients.push(...own);
      const locker = new Redlock(own, { ...options, prefix, ...(quorum === undefined ? {} : { quorum }) });
      lockers.push(locker);
      return locker;
    };
    const locker = make();
    const admins = used.map((n) => n.client());
    clients.push(...admins);
    return {
      locker,
      newConnectionLocker: make,
      // A waiter counts once it listens on some node (one live subscription is enough to wake it) and that subscription
      // is confirmed; it attempts again right after, so a release from then on reaches it.
      waiting: async (key) => {
        const channel = lockNames(prefix, key).channel;
        let n = 0;
        for (const l of lockers) {
          const shares = (l as unknown as { store: { wakeups: WakeupShareInternals[] } }).store.wakeups;
          const armed = await Promise.all(
            shares.map(async (w) => {
              const ch = w.wakeups.channels.get(channel);
              if (!ch || ch.listeners.size === 0 || !ch.ready) return false;
              return ch.ready.then(
                () => true,
                () => false,
              );
            }),
          );
          if (armed.some(Boolean)) n++;
        }
        return n;
      },
      deleteBehindBack: async (key) => {
        // Every node loses the lock: the one failure Redlock cannot survive, as on a single node.
        await Promise.all(admins.map((a) => a.del(lockNames(prefix, key).lock)));
      },
      roundTrip: () => admins[0]!.incr(`${prefix}critical-sections`),
      cleanup: async () => {
        for (const l of lockers) l.close();
        for (const c of clients) c.disconnect();
      },
    };
  };
}

lockContract('Redlock (5 nodes)', redlockFixture(5));
lockContract('Redlock (2 nodes, quorum 2)', redlockFixture(2));
lockContract('Redlock (4 nodes, quorum 3)', redlockFixture(4));
lockContract('Redlock (3 nodes, quorum 3)', redlockFixture(3, 3));
