// Redlock where 2q > N + 1 (an even number of nodes, or a quorum above a bare majority): "more than N − q nodes
// refused" then says only that this caller cannot win, not that somebody holds the key, and "more than N − q nodes no
// longer hold the lease" leaves the others holding it for nobody. Five private redis-server masters, used 2 to 5 at a
// time.
import { describe, expect, it, onTestFinished } from 'vitest';
import { LockLostError, Redlock } from '../../packages/core/src/index.js';
import { lockNames } from '../../packages/core/src/lock/redis-store.js';
import { until } from '../core/helpers.js';
import { freshPrefix, privateNodes } from './support.js';

const nodes = privateNodes(5);

/** A Redlock on the first `count` nodes, with connections of its own. */
function redlockOn(count: number, prefix: string, quorum?: number): Redlock {
  return nodes().redlock({ prefix, ...(quorum === undefined ? {} : { quorum }) }, count).locker;
}

// [nodes, quorum (undefined: the default), nodes holding short stale locks of others, one holder per group]: the stale
// locks are on more than N − q nodes, so this caller cannot win the first round, but no holder has q of them, so nobody
// holds the key either.
const splits: [number, number | undefined, number[][]][] = [
  [4, undefined, [[2, 3]]],
  [2, undefined, [[1]]],
  [3, 3, [[2]]],
  // The other two callers of a triple submit, two nodes each: four refusals, but no holder with three.
  [5, undefined, [[1, 2], [3, 4]]],
];

describe.each(splits)('on %i nodes, quorum %s, stale locks on nodes %j', (count, quorum, groups) => {
  it('tryAcquire with wait 0 takes the refusals for a split vote, retries, and wins once the stale locks are gone', async () => {
    const prefix = freshPrefix('quorum-split');
    const locker = redlockOn(count, prefix, quorum);
    // The other callers of a double or triple submit: each a Redlock over its group of nodes, so that its lock has one
    // token there.
    const others = groups.map((group) => {
      const clients = group.map((i) => nodes().nodes[i]!.client());
      const other = new Redlock(clients, { prefix });
      onTestFinished(() => {
        other.close();
        for (const c of clients) c.disconnect();
      });
      return other;
    });
    for (let round = 0; round < 3; round++) {
      const key = `order:${round}`;
      // What they leave for a moment.
      for (const other of others) expect(await other.tryAcquire(key, { ttl: 40 })).not.toBeNull();
      const started = performance.now();
      const lease = await locker.tryAcquire(key, { ttl: 5_000 });
      expect(lease, `round ${round}: not busy, since nobody holds a quorum`).not.toBeNull();
      // It waited for a retry after the stale locks' 40 ms, and not for much more than the retries allow.
      expect(performance.now() - started).toBeGreaterThanOrEqual(35);
      expect(performance.now() - started).toBeLessThan(2_000);
      await lease!.release();
    }
  });
});

it.each([
  [3, 3, [2]],
  [4, undefined, [2, 3]],
  [5, undefined, [2, 3, 4]],
] as [number, number | undefined, number[]][])(
  'on %i nodes, quorum %s, an extension that finds the lease lost on nodes %j frees it where it was kept',
  async (count, quorum, lost) => {
    const prefix = freshPrefix('quorum-lost');
    const holder = redlockOn(count, prefix, quorum);
    const other = redlockOn(count, prefix, quorum);
    const lease = await holder.acquire('k', { ttl: 5_000 });
    const name = lockNames(prefix, 'k').lock;
    // Every node holds it (the acquire settled at the quorum; the others' grants follow).
    const held = async () => Promise.all(nodes().admins.slice(0, count).map(async (a) => (await a.exists(name)) === 1));
    await until(async () => (await held()).every(Boolean), 2_000, 'the lock on every node');
    // The lock goes missing where a node lost its data (restarted empty): the same as deleting it there.
    for (const i of lost) await nodes().admins[i]!.del(name);
    await expect(lease.extend(20_000)).rejects.toBeInstanceOf(LockLostError);
    // The nodes that still held it were just extended for 20 s, for a lease that is over: they let it go, so that the
    // key is free for the next caller (with 2q > N + 1 they alone would keep everyone out).
    await until(async () => !(await held()).some(Boolean), 2_000, 'the lock to be freed where it was kept');
    const next = await other.tryAcquire('k', { ttl: 1_000 });
    expect(next).not.toBeNull();
    await next!.release();
  },
);
