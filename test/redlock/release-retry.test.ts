// A Redlock release sent again after it failed (LeaseImpl.retryRelease) still takes its lease's place out of the line,
// so the next waiter gets the lock at once, not after the place's heartbeat runs out.
import { Redis } from 'ioredis';
import { afterAll, expect, it } from 'vitest';
import { Redlock } from '../../packages/core/src/index.js';
import { lockNames } from '../../packages/core/src/lock/redis-store.js';
import { startProxy } from '../harness/proxy.js';
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

// Also when node 0 stays unreachable past the first re-sends (its client reconnects only after 800 ms): the release is
// sent again, backing off, until it gets through, not once (review 57's mutant M1 survived the other cases).
it.each([
  [undefined, undefined],
  ['A', undefined],
  [undefined, 800],
] as const)('sends a release again to a node it could not reach, once a quorum freed the lock (owner %s, reconnect after %s ms)', async (owner, reconnectMs) => {
  const nodes = await startRedisNodes(3);
  const admins = nodes.map((n) => n.client());
  const clients = nodes.map((n, i) => n.client(i === 0 && reconnectMs !== undefined ? { retryStrategy: () => reconnectMs } : undefined));
  const prefix = freshPrefix('retry-minority');
  const locks = new Redlock(clients, { ttl: 10_000, prefix });
  const lock = lockNames(prefix, 'k').lock;
  try {
    const lease = await locks.acquire('k', { owner });
    // (Node 0's grant may land after the round settled on the other two.)
    await until(async () => (await admins[0]!.exists(lock)) === 1, 2_000, 'node 0 to grant');
    // Node 0's connection drops: the release cannot go out there (it is reconnecting), but nodes 1 and 2 free it.
    await admins[0]!.call('CLIENT', 'KILL', 'TYPE', 'normal');
    await notReady(clients[0]!);
    expect(await lease.release()).toBe(true);
    // Not left there for the rest of its 10 s ttl, voting against everyone (and, with an owner, kept alive there by
    // the owner's re-entries).
    await until(async () => (await admins[0]!.exists(lock)) === 0, reconnectMs === undefined ? 3_000 : 4_000, 'the release to reach node 0');
  } finally {
    locks.close();
    for (const client of [...clients, ...admins]) client.disconnect();
  }
});

it.each([undefined, 'A'])('sends the hand-back of an aborted acquire’s grant again to a node it could not reach (owner %s)', async (owner) => {
  const nodes = await startRedisNodes(3);
  const admins = nodes.map((n) => n.client());
  const proxies = await Promise.all([startProxy(nodes[1]!.port), startProxy(nodes[2]!.port)]);
  const clients = [nodes[0]!.client(), ...proxies.map((p) => new Redis({ host: '127.0.0.1', port: p.port }))];
  for (const c of clients) c.on('error', () => undefined);
  const prefix = freshPrefix('handback-minority');
  const locks = new Redlock(clients, { prefix, ttl: 10_000, timeout: 3_000, nodeTimeout: 3_000 });
  const lock = lockNames(prefix, 'k').lock;
  try {
    await Promise.all(clients.map((c) => c.ping()));
    // The round is granted everywhere, but nodes 1 and 2's answers are held: the caller gives up meanwhile.
    const passes = proxies.map((p) => p.holdReplies());
    const controller = new AbortController();
    const acquiring = locks.acquire('k', { owner, signal: controller.signal }).catch((e: unknown) => e);
    await until(async () => (await Promise.all(admins.map((a) => a.exists(lock)))).every((e) => e === 1), 2_000, 'the round to be granted');
    controller.abort(new Error('gave up'));
    expect(await acquiring).toMatchObject({ message: 'gave up' });
    // Node 0's connection drops: the hand-back of the grant cannot go out there.
    await admins[0]!.call('CLIENT', 'KILL', 'TYPE', 'normal');
    await notReady(clients[0]!);
    for (const pass of passes) pass();
    await until(async () => (await admins[1]!.exists(lock)) + (await admins[2]!.exists(lock)) === 0, 2_000, 'nodes 1 and 2 to be freed');
    // Not left on node 0 for the rest of its 10 s ttl.
    await until(async () => (await admins[0]!.exists(lock)) === 0, 3_000, 'the hand-back to reach node 0');
  } finally {
    locks.close();
    for (const c of [...clients, ...admins]) c.disconnect();
    for (const p of proxies) await p.close();
  }
});
