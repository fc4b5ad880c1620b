// Locker fixtures for the contract suite: MemoryLock, and RedisLock on a harness node or any client (one per locker).
import { MemoryLock, RedisLock, type LockerOptions, type RedisClient } from '../../packages/core/src/index.js';
import { lockNames } from '../../packages/core/src/lock/redis-store.js';
import type { RedisNode } from '../harness/redis.js';
import type { LockerFixture, MakeLocker } from './lock-contract.js';
import { uniquePrefix } from './helpers.js';

/** The private parts of MemoryLock's store the fixture needs to observe waiters and to lose a lock on purpose. */
interface MemoryStoreInternals {
  locks: Map<string, unknown>;
  listeners: Map<string, Set<unknown>>;
}

/** MemoryLock: one store per fixture; "another connection" is the same locker, since there is no connection. */
export const memoryLockFixture: MakeLocker = async (options?: LockerOptions): Promise<LockerFixture> => {
  const locker = new MemoryLock(options);
  const store = (locker as unknown as { store: MemoryStoreInternals }).store;
  return {
    locker,
    newConnectionLocker: () => locker,
    waiting: async (key) => store.listeners.get(key)?.size ?? 0,
    deleteBehindBack: async (key) => {
      store.locks.delete(key);
    },
    cleanup: async () => locker.close(),
  };
};

/** RedisLock on `node()`: every locker gets its own ioredis connection and shares the fixture's unique prefix. */
export function redisLockFixture(node: () => RedisNode): MakeLocker {
  return redisClientLockFixture('lock', () => node().client(), async (admin, channel) => {
    const [, subscribers] = (await admin.pubsub('NUMSUB', channel)) as [string, number];
    return Number(subscribers);
  });
}

/**
 * RedisLock on clients from `connect()` (one Redis or a Cluster): every locker gets its own client and shares the
 * fixture's unique prefix, which starts with `label`. `subscribers` counts the listeners of a lock's channel: a waiter
 * is armed once it is subscribed and queued.
 */
export function redisClientLockFixture<C extends RedisClient>(
  label: string,
  connect: () => C,
  subscribers: (admin: C, channel: string) => Promise<number>,
): MakeLocker {
  return async (options?: LockerOptions): Promise<LockerFixture> => {
    const prefix = uniquePrefix(label);
    const clients: C[] = [];
    const lockers: RedisLock[] = [];
    const make = (): RedisLock => {
      const client = connect();
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

/**
 * Keys built to break a key-to-Redis-name mapping: braces (hash tags), the escape character and escapes, shapes of
 * another key's internal names (lock, fence, queue, deadlines, channel), NUL, line breaks, lone UTF-16 surrogates
 * (ioredis would turn each into U+FFFD), a valid pair, and a megabyte of text.
 */
export const HOSTILE_KEYS: readonly string[] = [
  'plain',
  '{',
  '}',
  '{}',
  '{a}',
  'a{b}c',
  '%',
  '%7D',
  '%25',
  '%ud800',
  'a',
  'a}',
  'a}:f',
  'a}:q',
  'a}:d',
  'a}:w',
  'a:f',
  'a\0b',
  '\0',
  '\n',
  'line\r\nbreak',
  '\uD800',
  '\uDBFF',
  '\uDC00',
  '\uFFFD',
  'x\uD800y',
  '\uD83D\uDE00',
  ' ',
  'k'.repeat(1 << 20),
];
