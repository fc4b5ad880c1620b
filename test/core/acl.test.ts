// hasp under Redis ACL users: the rules the core README gives are enough for locks, wake-ups and buckets, and a user
// without channel permissions (Redis 7's default for a new user) still frees its locks cleanly.
import type { Redis } from 'ioredis';
import { describe, expect, it } from 'vitest';
import { RedisLock, TokenBucket, type LockErrorEvent } from '../../packages/core/src/index.js';
import { lockNames } from '../../packages/core/src/lock/redis-store.js';
import { startRedis } from '../harness/redis.js';
import { privateRedis, uniquePrefix, until, within } from './helpers.js';

const server = privateRedis();

// What packages/core/README.md ("Redis ACLs") says to grant, for the default prefixes.
const DOCUMENTED = ['~hasp:*', '&hasp:*', '+@read', '+@write', '+@scripting', '+@pubsub', '+@connection', '+time', '+info'];

/** A client logged in as a fresh ACL user with `rules` (and no channels unless the rules grant them). */
async function userClient(name: string, rules: string[]): Promise<Redis> {
  await server.admin.acl('SETUSER', name, 'reset', 'on', '>pw', ...rules);
  return server.node.client({ username: name, password: 'pw' });
}

/** Holds `key` on one client, queues a waiter from another in Redis, releases, and reports what happened. */
async function handOver(
  clients: [Redis, Redis],
  prefix: string,
  key: string,
  subscribes: boolean,
  admin: Redis = server.admin,
): Promise<{ released: boolean; subscribed: number; errors: LockErrorEvent[] }> {
  const errors: LockErrorEvent[] = [];
  const holder = new RedisLock(clients[0], { prefix, onError: (e) => errors.push(e) });
  const waiter = new RedisLock(clients[1], { prefix });
  try {
    const held = await holder.acquire(key);
    const waiting = waiter.acquire(key, { wait: 10_000 });
    const names = lockNames(prefix, key);
    await until(async () => (await admin.zcard(names.queue)) === 1, 3_000, 'the waiter to queue in Redis');
    const numsub = async (): Promise<number> => Number(((await admin.pubsub('NUMSUB', names.channel)) as (string | number)[])[1]);
    // Its SUBSCRIBE follows its first refusal: confirmed when the rules allow it (refused at once otherwise).
    if (subscribes) await until(async () => (await numsub()) === 1, 3_000, 'the waiter to subscribe');
    const subscribed = await numsub();
    const released = await within(held.release(), 3_000, 'the release');
    const lease = await within(waiting, 5_000, 'the waiter');
    await lease.release();
    return { released, subscribed, errors };
  } finally {
    holder.close();
    waiter.close();
  }
}

describe('hasp under Redis ACLs', () => {
  it('works with the rules the README gives: locks, wake-ups, buckets', async () => {
    const clients: [Redis, Redis] = [await userClient('documented', DOCUMENTED), await userClient('documented', DOCUMENTED)];
    const outcome = await handOver(clients, 'hasp:lock:', `acl-${uniquePrefix('doc')}`, true);
    expect(outcome).toEqual({ released: true, subscribed: 1, errors: [] });
    const bucket = new TokenBucket({ capacity: 2, rate: '2/min', redis: clients[0] });
    const key = uniquePrefix('acl-bucket');
    const takes = async (n: number): Promise<boolean[]> => {
      const out: boolean[] = [];
      for (let i = 0; i < n; i++) out.push((await bucket.take(key)).allowed);
      return out;
    };
    expect(await takes(3)).toEqual([true, true, false]);
    expect((await bucket.peek(key)).allowed).toBe(false);
    await bucket.reset(key);
    expect(await takes(1)).toEqual([true]);
    for (const c of clients) c.disconnect();
  });

  // A connection's first call of a script goes as EVAL, later ones as EVALSHA: without EVALSHA, an acquire worked and
  // its release was refused (the lock stayed for its ttl), and every other call failed or not by chance.
  it('runs every call as EVAL for a server that refuses EVALSHA (an ACL user without it, or the command renamed away)', async () => {
    const renamed = await startRedis({ args: ['--rename-command', 'EVALSHA', '""'] });
    const noEvalsha = [...DOCUMENTED, '-evalsha'];
    const renamedAdmin = renamed.client();
    const setups: [string, () => Promise<Redis>, Redis][] = [
      ['an ACL user without EVALSHA', () => userClient('noevalsha', noEvalsha), server.admin],
      ['EVALSHA renamed away', async () => renamed.client(), renamedAdmin],
    ];
    try {
      for (const [setup, connect, admin] of setups) {
        const clients: [Redis, Redis] = [await connect(), await connect()];
        const key = `acl-${uniquePrefix('noevalsha')}`;
        const errors: LockErrorEvent[] = [];
        const locks = new RedisLock(clients[0], { onError: (e) => errors.push(e) });
        const bucket = new TokenBucket({ capacity: 3, rate: '3/min', redis: clients[0] });
        try {
          const outcomes: unknown[] = [];
          for (let i = 0; i < 3; i++) {
            const lease = await locks.acquire(key);
            outcomes.push(await lease.release(), (await bucket.take(key)).allowed);
          }
          expect({ setup, outcomes, errors }).toEqual({ setup, outcomes: [true, true, true, true, true, true], errors: [] });
          expect((await bucket.take(key)).allowed).toBe(false);
          // A hand-over between two clients, with a waiter queued in Redis and woken by its message, works too.
          expect(await handOver(clients, 'hasp:lock:', `${key}-h`, true, admin)).toEqual({ released: true, subscribed: 1, errors: [] });
        } finally {
          locks.close();
          for (const c of clients) c.disconnect();
        }
      }
    } finally {
      await renamed.stop();
    }
  });

  it('frees a lock whose waiter cannot subscribe (no channel permissions): release resolves, the waiter polls in', async () => {
    // Redis 7 gives a new user no channels (acl-pubsub-default resetchannels), Redis 6.2 all of them unless told:
    // the release script's wake-up is refused.
    const rules = ['resetchannels', '~*', '+@all'];
    const clients: [Redis, Redis] = [await userClient('nochannels', rules), await userClient('nochannels', rules)];
    const outcome = await handOver(clients, uniquePrefix('acl-nochan'), 'k', false);
    expect(outcome).toEqual({ released: true, subscribed: 0, errors: [] });
    for (const c of clients) c.disconnect();
  });
});
