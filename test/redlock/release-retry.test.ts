// A Redlock release sent again after it failed (LeaseImpl.retryRelease) still takes its lease's place out of the line,
// so the next waiter gets the lock at once, not after the place's heartbeat runs out.
import { afterAll, expect, it } from 'vitest';
import { Redlock } from '../../packages/core/src/index.js';
import { lockNames } from '../../packages/core/src/lock/redis-store.js';
import { startRedisNodes, stopAll } from '../harness/redis.js';
import { until, within } from '../core/helpers.js';
import { freshPrefix, notReady } from './support.js';

afterAll(stopAll);

it('lets the next waiter in soon after a release that met dropped connections went through on its second try', async () => {
  const nodes = await startRedisNodes(3);
  const admins = nodes.map((n) => n.client());
  const clients = () => nodes.map((n) => n.client());
  const prefix = freshPrefix('retry-line');
  const [a, b, c] = [clients(), clients(), clients()];
  const [A, B, C] = [a, b, c].map((cs) => new Redlock(cs, { ttl: 10_000, prefix }));
  try {
    // A waits behind C, so it holds the lock with a place in every node's line.
    const held = await C!.acquire('k');
    const pa = A!.acquire('k', { wait: 5_000 });
    const line = lockNames(prefix, 'k').queue;
    await until(async () => (await admins[0]!.zcard(line)) === 1, 3_000, 'A to join the line');
    await held.release();
    const lease = await within(pa, 3_000, "A's acquire");
    // B waits behind A.
    const pb = B!.acquire('k', { wait: 8_000 });
    pb.catch(() => undefined);
    await until(async () => (await admins[0]!.zcard(line)) === 2, 3_000, 'B to join the line');
    // Every client connection drops (the admin's is kept: CLIENT KILL skips its caller): A's release fails unsent,
    // and goes again 100 ms later.
    await Promise.all(admins.map((admin) => admin.call('CLIENT', 'KILL', 'TYPE', 'normal')));
    await Promise.all(a.map((client) => notReady(client)));
    const released = performance.now();
    await expect(lease.release()).rejects.toThrow(/no quorum/);
    const next = await within(pb, 5_000, "B's acquire");
    // Not after A's place timed out in the line (over a second).
    expect(performance.now() - released).toBeLessThan(700);
    await next.release();
  } finally {
    for (const l of [A, B, C]) l!.close();
    for (const client of [...a, ...b, ...c, ...admins]) client.disconnect();
  }
});

it.each([undefined, 'A'])('sends a release again to a node it could not reach, once a quorum freed the lock (owner %s)', async (owner) => {
  const nodes = await startRedisNodes(3);
  const admins = nodes.map((n) => n.client());
  const clients = nodes.map((n) => n.client());
  const prefix = freshPrefix('retry-minority');
  const locks = new Redlock(clients, { ttl: 10_000, prefix });
  const lock = lockNames(prefix, 'k').lock;
  try {
    const lease = await locks.acquire('k', { owner });
    expect(await admins[0]!.exists(lock)).toBe(1);
    // Node 0's connection drops: the release cannot go out there (it is reconnecting), but nodes 1 and 2 free it.
    await admins[0]!.call('CLIENT', 'KILL', 'TYPE', 'normal');
    await notReady(clients[0]!);
    expect(await lease.release()).toBe(true);
    // Not left there for the rest of its 10 s ttl, voting against everyone (and, with an owner, kept alive there by
    // the owner's re-entries).
    await until(async () => (await admins[0]!.exists(lock)) === 0, 3_000, 'the release to reach node 0');
  } finally {
    locks.close();
    for (const client of [...clients, ...admins]) client.disconnect();
  }
});
