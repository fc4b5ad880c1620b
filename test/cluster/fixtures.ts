// RedisLock on a Redis Cluster as a Locker contract fixture.
import type { Cluster } from 'ioredis';
import { RedisLock, type LockerOptions } from '../../packages/core/src/index.js';
import { lockNames } from '../../packages/core/src/lock/redis-store.js';
import type { RedisCluster } from '../harness/redis.js';
import type { LockerFixture, MakeLocker } from '../core/lock-contract.js';
import { uniquePrefix } from '../core/helpers.js';
import { subscribers } from './support.js';

/** RedisLock on a Cluster: every locker gets its own `Cluster` client and shares the fixture's unique prefix. */
export function clusterLockFixture(cluster: () => RedisCluster): MakeLocker {
  return async (options?: LockerOptions): Promise<LockerFixture> => {
    const prefix = uniquePrefix('cluster-lock');
    const clients: Cluster[] = [];
    const lockers: RedisLock[] = [];
    const make = (): RedisLock => {
      const client = cluster().client();
      clients.push(client);
      const locker = new RedisLock(client, { ...options, prefix });
      lockers.push(locker);
      return locker;
    };
    const locker = make();
    const admin = clients[0]!;
    return {
      locker,
      newConnectionLocker: make,
      // As on one node: a waiter is armed once it is subscribed (on whichever node its subscriber landed) and queued.
      waiting: async (key) => {
        const names = lockNames(prefix, key);
        return (await subscribers(admin, names.channel)) > 0 ? admin.zcard(names.queue) : 0;
      },
      deleteBehindBack: async (key) => {
        await admin.del(lockNames(prefix, key).lock);
      },
      roundTrip: () => admin.incr(`${prefix}critical-sections`),
      cleanup: async () => {
        for (const l of lockers) l.close();
        for (const c of clients) c.disconnect();
      },
    };
  };
}
