// Redlock's validity arithmetic, checked against what the nodes really hold: a lease's expiresAt never lies past the
// instant by which a quorum of nodes still holds its lock (read back with PTTL) less the drift allowance, and gives up
// no more than the time the call took plus that allowance. Each bound is read on the side that cannot fail the real
// code on a slow machine (an end read after PTTL answered for the upper bounds, before it was sent for the lower).
import { Redis } from 'ioredis';
import { describe, expect, it, onTestFinished } from 'vitest';
import { Redlock, type Lease } from '../../packages/core/src/index.js';
import { driftFor, lockNames } from '../../packages/core/src/lock/redis-store.js';
import { startProxy } from '../harness/proxy.js';
import { until, within } from '../core/helpers.js';
import { freshPrefix, privateNodes } from './support.js';

const nodes = privateNodes(5);
const DRIFT = 0.01; // Redlock's default driftFactor

/**
 * When the `q`-th longest-holding node lets `key`'s lock go (Date.now() ms): `low` counts each node's PTTL from before
 * it was asked, `high` from after it answered, so the true instant lies between them.
 */
async function quorumEnd(prefix: string, key: string, q: number): Promise<{ low: number; high: number }> {
  const name = lockNames(prefix, key).lock;
  const ends = await Promise.all(
    nodes().admins.map(async (a) => {
      const before = Date.now();
      const pttl = await a.pttl(name);
      return pttl < 0 ? { low: -Infinity, high: -Infinity } : { low: before + pttl, high: Date.now() + pttl };
    }),
  );
  const nth = (side: 'low' | 'high'): number => ends.map((e) => e[side]).sort((x, y) => y - x)[q - 1]!;
  return { low: nth('low'), high: nth('high') };
}

/** Waits until every node holds `key`'s lock (an acquire or extension settles at the quorum). */
function onEveryNode(prefix: string, key: string): Promise<void> {
  return until(async () => (await nodes().holders(prefix, key)).length === 5, 2_000, 'the lock on every node');
}

describe('Redlock validity', () => {
  it('ends an acquired lease no later than a quorum of nodes holds its lock, less the drift allowance', async () => {
    const prefix = freshPrefix('validity-acquire');
    const { locker } = nodes().redlock({ prefix });
    const TTL = 20_000;
    const before = Date.now();
    const lease = await locker.acquire('k', { ttl: TTL });
    await onEveryNode(prefix, 'k');
    const end = await quorumEnd(prefix, 'k', 3);
    // Drift is taken off the time the nodes hold the lock (+1 ms for the roundings of PTTL and the clocks)...
    expect(lease.expiresAt).toBeLessThanOrEqual(end.high - driftFor(TTL, DRIFT) + 1);
    // ...once, and the lease is counted from before the call was sent.
    expect(lease.expiresAt).toBeGreaterThanOrEqual(before + TTL - driftFor(TTL, DRIFT) - 1);
    expect(await lease.release()).toBe(true);
  });

  it('extends no further than the quorum-th node holds the lock, and at least as far as the node that holds it least', async () => {
    const prefix = freshPrefix('validity-extend');
    const { locker } = nodes().redlock({ prefix });
    const lease: Lease = await locker.acquire('k', { ttl: 10_000 });
    await onEveryNode(prefix, 'k');
    const name = lockNames(prefix, 'k').lock;
    // The nodes hold the lock 60, 50, 40, 30, 20 s: a quorum of 3 holds it for 40 s. (The extension settles at the
    // first 3 answers, so it may see less: the quorum-th of what it heard, at least the 20 s of the least.)
    await Promise.all(nodes().admins.map((a, i) => a.pexpire(name, [60_000, 50_000, 40_000, 30_000, 20_000][i]!)));
    const asked = Date.now();
    await lease.extend(1_000); // shorter than every node's: an extension never shortens, each answers its own PTTL
    const took = Date.now() - asked;
    const end = await quorumEnd(prefix, 'k', 3);
    const least = await quorumEnd(prefix, 'k', 5);
    // The lease counts from when the extension was sent, a node's time from when it ran (at most `took` apart); drift
    // is taken off the remaining time the extension counted on (20 to 40 s, less that).
    const upper = Math.max(end.high - driftFor(40_000 - took, DRIFT), least.high - driftFor(20_000 - took, DRIFT));
    expect(lease.expiresAt).toBeLessThanOrEqual(upper + 1);
    expect(lease.expiresAt).toBeGreaterThanOrEqual(least.low - took - driftFor(40_000, DRIFT) - 1);
    expect(await lease.release()).toBe(true);
  });

  it('counts a lease won in a later round from that round’s start, not from when its replies came back', async () => {
    const prefix = freshPrefix('validity-late-reply');
    // Nodes 2, 3, 4 behind proxies that hold their replies back: the first round times out on them (1 s), the second
    // is granted on every node at once but hears back from them only once the replies are let through (100 ms later:
    // a node timeout well above that, so a stalled process cannot fail the round the test needs to win).
    const proxies = await Promise.all([2, 3, 4].map((i) => startProxy(nodes().nodes[i]!.port)));
    const clients = [
      ...[0, 1].map((i) => nodes().nodes[i]!.client()),
      ...proxies.map((p) => new Redis({ host: '127.0.0.1', port: p.port }).on('error', () => undefined)),
    ];
    const locker = new Redlock(clients, { prefix, nodeTimeout: 1_000, retryCount: 2, retryDelay: 1 });
    onTestFinished(async () => {
      locker.close();
      for (const c of clients) c.disconnect();
      await Promise.all(proxies.map((p) => p.close()));
    });
    // Scripts loaded (every later call an EVALSHA), connections up.
    const warm = await locker.acquire('warm-up');
    await warm.extend();
    await warm.release();
    const TTL = 20_000;
    const lets = proxies.map((p) => p.holdReplies());
    const firstRound = proxies[0]!.sent('evalsha');
    const before = Date.now();
    const acquiring = locker.acquire('k', { ttl: TTL });
    await within(firstRound, 5_000, 'the first round');
    await within(proxies[0]!.sent('evalsha'), 5_000, 'the second round, once the first timed out');
    // The replies of the round that wins come 100 ms after it set the locks: the lateness under test.
    await new Promise((resolve) => setTimeout(resolve, 100));
    for (const go of lets) go();
    const lease = await within(acquiring, 5_000, 'the acquire');
    await onEveryNode(prefix, 'k');
    const end = await quorumEnd(prefix, 'k', 3);
    expect(lease.expiresAt).toBeLessThanOrEqual(end.high - driftFor(TTL, DRIFT) + 1);
    expect(lease.expiresAt).toBeGreaterThanOrEqual(before + TTL - driftFor(TTL, DRIFT) - 1);
    // The same for an extension whose replies come back late: counted from when it was sent, not from its replies.
    const held = proxies.map((p) => p.holdReplies());
    const extended = proxies[0]!.sent('evalsha');
    const asked = Date.now();
    const extending = lease.extend(TTL);
    await within(extended, 5_000, 'the extension to be sent');
    await new Promise((resolve) => setTimeout(resolve, 100)); // the lateness under test
    for (const go of held) go();
    await within(extending, 5_000, 'the extension');
    const extendedEnd = await quorumEnd(prefix, 'k', 3);
    expect(lease.expiresAt).toBeLessThanOrEqual(extendedEnd.high - driftFor(TTL - (Date.now() - asked), DRIFT) + 1);
    expect(lease.expiresAt).toBeGreaterThanOrEqual(asked + TTL - driftFor(TTL, DRIFT) - 1);
    expect(await lease.release()).toBe(true);
  });
});
