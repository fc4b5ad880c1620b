// The pub/sub wake-up connection against a real redis-server: subscriptions made at any point of the subscriber's
// life take effect, so waiters are woken by messages rather than by the polling fallback.
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RedisLock } from '../../packages/core/src/index.js';
import { lockNames } from '../../packages/core/src/lock/redis-store.js';
import { Wakeups } from '../../packages/core/src/redis/wakeups.js';
import { startRedis, stopAll, type RedisNode } from '../harness/redis.js';
import { uniquePrefix, until, within } from './helpers.js';

let node: RedisNode;
let admin: Redis;

beforeAll(async () => {
  node = await startRedis();
  admin = node.client();
});

afterAll(async () => {
  await stopAll();
});

/** Subscriber count of each channel, as the server sees it. */
async function numsub(channels: string[]): Promise<number[]> {
  const reply = (await admin.pubsub('NUMSUB', ...channels)) as (string | number)[];
  return channels.map((_, i) => Number(reply[2 * i + 1]));
}

describe('Wakeups', () => {
  it('subscribes a channel asked for while the subscriber connection is still in its handshake', async () => {
    const wakeups = new Wakeups(node.client(), 2_000);
    try {
      const heard: string[] = [];
      const first = wakeups.listen('wake:first', (m) => heard.push(`first:${m}`));
      // The subscriber connection exists now and is connecting; ask for a second channel the moment the socket is
      // connected, while ioredis is still running its handshake (CLIENT SETINFO, the INFO ready check).
      const sub = (wakeups as unknown as { subscriber: Redis }).subscriber;
      const second = await within(
        new Promise<Promise<() => void>>((resolve) =>
          sub.once('connect', () => resolve(wakeups.listen('wake:second', (m) => heard.push(`second:${m}`)))),
        ),
        5_000,
        'the subscriber to connect',
      );
      await within(Promise.all([first, second]), 3_000, 'both subscriptions');
      expect(await numsub(['wake:first', 'wake:second'])).toEqual([1, 1]);
      await admin.publish('wake:first', 'a');
      await admin.publish('wake:second', 'b');
      await until(() => heard.length === 2, 2_000, 'both messages');
      expect(heard).toEqual(['first:a', 'second:b']);
    } finally {
      wakeups.close();
    }
  });
});

describe('RedisLock wake-ups', () => {
  it('subscribes every waiter of a fresh locker, including those that start while its subscriber connects', async () => {
    const prefix = uniquePrefix('subs');
    const holder = new RedisLock(node.client(), { prefix });
    const waiter = new RedisLock(node.client(), { prefix });
    const keys = Array.from({ length: 12 }, (_, i) => `key-${i}`);
    const pending = [];
    for (const key of keys) {
      const lease = await holder.acquire(key, { ttl: 30_000 });
      const waiting = waiter.acquire(key, { wait: 10_000 });
      waiting.catch(() => undefined);
      pending.push({ lease, waiting });
    }
    const channels = keys.map((k) => lockNames(prefix, k).channel);
    await until(
      async () => (await numsub(channels)).every((n) => n === 1),
      3_000,
      'every waiter to be subscribed to its wake-up channel',
    );
    // Each waiter gets its lock as soon as it is released, not after a polling delay.
    for (const { lease, waiting } of pending) {
      const releasedAt = performance.now();
      await lease.release();
      const got = await within(waiting, 5_000, 'the waiting acquire');
      expect(performance.now() - releasedAt).toBeLessThan(200);
      await got.release();
    }
    holder.close();
    waiter.close();
  });
});
