// RedisLock on a Redis Cluster as a Locker contract fixture.
import type { RedisCluster } from '../harness/redis.js';
import type { MakeLocker } from '../core/lock-contract.js';
import { redisClientLockFixture } from '../core/fixtures.js';
import { subscribers } from './support.js';

/**
 * RedisLock on a Cluster: every locker gets its own `Cluster` client and shares the fixture's unique prefix. As on one
 * node, a waiter is armed once it is subscribed (on whichever node its subscriber landed) and queued.
 */
export function clusterLockFixture(cluster: () => RedisCluster): MakeLocker {
  return redisClientLockFixture('cluster-lock', () => cluster().client(), subscribers);
}
