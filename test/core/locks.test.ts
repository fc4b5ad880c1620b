// Runs the Locker contract against MemoryLock and against RedisLock on a private redis-server.
import { afterAll, beforeAll } from 'vitest';
import { startRedis, stopAll, type RedisNode } from '../harness/redis.js';
import { memoryLockFixture, redisLockFixture } from './fixtures.js';
import { lockContract } from './lock-contract.js';

let node: RedisNode;

beforeAll(async () => {
  node = await startRedis();
});

afterAll(async () => {
  await stopAll();
});

lockContract('MemoryLock', memoryLockFixture);
lockContract('RedisLock', redisLockFixture(() => node));
