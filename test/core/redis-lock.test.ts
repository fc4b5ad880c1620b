// RedisLock against a real redis-server beyond the shared contract: a dead or frozen server, and where keys and
// channels live in Redis, and a line whose first waiter went away.
import { once } from 'node:events';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { Redis, type RedisOptions } from 'ioredis';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import {
  LockLostError,
  LockUnavailableError,
  RedisLock,
  type Lease,
  type LockErrorEvent,
} from '../../packages/core/src/index.js';
import { startProxy, type Proxy } from '../harness/proxy.js';
import { startRedis, stopAll, type RedisNode } from '../harness/redis.js';
import { lockNames } from '../../packages/core/src/lock/redis-store.js';
import { FIRST_LIVE_SWEEP, FREE_HEAD_GRACE_MS, LEAVE } from '../../packages/core/src/lock/scripts.lua.js';
import { HOSTILE_KEYS } from './fixtures.js';
import { trackUnhandled } from '../redlock/support.js';
import { abortReason, refusalCounter, rejection, uniquePrefix, until, within } from './helpers.js';

afterAll(async () => {
  await stopAll();
});

/** Waits until `locks` can take `key` (and gives it back at once): whatever held it has let go. */
function takenOnceFree(locks: RedisLock, key: string, what: string): Promise<void> {
  return until(
    async () => {
      const lease = await locks.tryAcquire(key);
      if (lease) await lease.release();
      return lease !== null;
    },
    2_000,
    what,
    20,
  );
}

/** Asserts a LockUnavailableError that keeps its cause. */
function expectUnavailable(error: unknown): void {
  expect(error).toBeInstanceOf(LockUnavailableError);
  expect(error).toMatchObject({ code: 'LOCK_UNAVAILABLE', name: 'LockUnavailableError' });
  expect((error as Error).cause).toBeDefined();
}

describe('RedisLock when Redis fails', () => {
  let node: RedisNode;
  const clients: Redis[] = [];
  const lockers: RedisLock[] = [];

  /** A RedisLock on a client with ioredis's default options (the harness only adds an error listener). */
  const locker = (options: ConstructorParameters<typeof RedisLock>[1] = {}): { redis: Redis; locks: RedisLock } => {
    const redis = node.client();
    const locks = new RedisLock(redis, { prefix: uniquePrefix('fail'), ...options });
    clients.push(redis);
    lockers.push(locks);
    return { redis, locks };
  };

  /** `lease` still holds its key 'k': another caller is refused, its signal has not aborted, and its release frees it. */
  const stillHolds = async (prefix: string, lease: Lease): Promise<void> => {
    expect(await locker({ prefix }).locks.tryAcquire('k')).toBeNull();
    expect(lease.signal.aborted).toBe(false);
    expect(await lease.release()).toBe(true);
  };

  /**
   * Waits until a waiter that just called acquire through `proxy` has made its two attempts (the first, then the one
   * right after it subscribed) and the second's refusal has reached `client`: it sleeps until woken or its poll, and
   * no reply of its is on the way.
   */
  const waiterAsleep = async (proxy: Proxy, client: Redis): Promise<void> => {
    await within(proxy.sent('evalsha'), 2_000, 'the first attempt');
    await within(proxy.sent('evalsha'), 2_000, 'the attempt after subscribing');
    expect(await client.ping()).toBe('PONG');
  };

  /** A RedisLock whose client (and so its wake-up connection, a copy of it) reaches the node through a proxy. */
  const proxied = async (
    prefix: string,
    options: RedisOptions = {},
    timeout?: number,
  ): Promise<{ proxy: Proxy; client: Redis; locks: RedisLock; close(): Promise<void> }> => {
    const proxy = await startProxy(node.port);
    const client = new Redis({ host: '127.0.0.1', port: proxy.port, ...options });
    client.on('error', () => undefined);
    const locks = new RedisLock(client, timeout === undefined ? { prefix } : { prefix, timeout });
    const close = async () => {
      locks.close();
      client.disconnect();
      await proxy.close();
    };
    return { proxy, client, locks, close };
  };

  // Failures in the background (auto-extension, a late hand-back) must never surface as unhandled rejections.
  let unhandled: ReturnType<typeof trackUnhandled>;

  beforeAll(async () => {
    node = await startRedis();
  });

  beforeEach(() => {
    unhandled = trackUnhandled();
  });

  afterEach(async () => {
    unhandled.stop();
    for (const l of lockers.splice(0)) l.close();
    for (const c of clients.splice(0)) c.disconnect();
    // Leave the node running and answering for the next test, whatever this one did to it.
    try {
      node.resume();
    } catch {
      // not running: restarted below
    }
    const probe = node.client({ lazyConnect: true, retryStrategy: () => null, maxRetriesPerRequest: 0 });
    const up = await probe
      .connect()
      .then(() => probe.ping())
      .catch(() => 'down');
    probe.disconnect();
    if (up !== 'PONG') await node.restart();
    expect(unhandled.reasons).toEqual([]);
  });

  it('leaves no unhandled rejection from a second release() left unawaited, when the release fails', async () => {
    const { redis, locks } = locker();
    const lease = await locks.acquire('twice');
    redis.disconnect();
    const first = lease.release();
    void lease.release();
    expectUnavailable(await rejection(first));
    // (Node reports an unhandled rejection after the microtasks of the turn it happened in; afterEach checks.)
    await new Promise((resolve) => setImmediate(resolve));
  });

  it('leaves no unhandled rejection when an async onError hook fails', async () => {
    const heard: string[] = [];
    const { locks } = locker({
      onError: async (e) => {
        heard.push(e.operation);
        await Promise.resolve();
        throw new Error('a broken async hook');
      },
    });
    const lease = await locks.acquire('k', { ttl: 100 });
    // Lost by its time: reported to the hook, whose promise rejects.
    await within(once(lease.signal, 'abort'), 2_000, 'the lease to be lost');
    await new Promise((resolve) => setImmediate(resolve));
    expect(heard).toEqual(['lost']);
    // (afterEach checks that no rejection went unhandled.)
  });

  it('rejects LockUnavailableError at once while the server is down, and works again after a restart', async () => {
    const { redis, locks } = locker();
    const held = await locks.acquire('held', { ttl: 30_000 });
    expect(await locks.tryAcquire('k')).not.toBeNull();

    await node.kill();
    // Every operation fails with the typed error within a bounded time (never ioredis's retry budget), naming the
    // server that failed.
    const bounded = <T>(p: Promise<T>, what: string) => within(rejection(p), 3_000, what);
    const refused = await bounded(locks.tryAcquire('k2'), 'tryAcquire');
    expectUnavailable(refused);
    // (At once when the client saw the connection close first; otherwise the call went out and timed out.)
    const server = `127\\.0\\.0\\.1:${node.port}`;
    expect((refused as Error).message).toMatch(new RegExp(`^lock acquire failed for "k2": Redis (connection to ${server} is |at ${server} did not answer)`));
    expect(refused).toMatchObject({ key: 'k2' });
    expectUnavailable(await bounded(locks.acquire('k2'), 'acquire'));
    expectUnavailable(await bounded(locks.acquire('k2', { wait: 5_000 }), 'acquire with wait'));
    let ran = false;
    expectUnavailable(
      await bounded(
        locks.using('k2', async () => {
          ran = true;
        }),
        'using',
      ),
    );
    expect(ran).toBe(false);
    expectUnavailable(await bounded(held.extend(), 'extend'));
    expectUnavailable(await bounded(held.release(), 'release'));

    await node.restart();
    // The client reconnects on its own (ioredis's retry strategy); then everything works again.
    await until(async () => (await redis.ping().catch(() => 'down')) === 'PONG', 10_000, 'the client to reconnect');
    // ioredis re-sends commands that were in flight when the socket died (autoResendUnfulfilledCommands), so an
    // acquire that already failed for us can land now; the locker hands such a late grant back at once.
    const lease = await locks.acquire('k2', { ttl: 5_000, wait: 2_000 });
    expect(await locks.tryAcquire('k2')).toBeNull();
    expect(await lease.release()).toBe(true);
    // A failed release may be retried; the lock died with the server's data, so there is nothing left to free.
    expect(await held.release()).toBe(false);
  });

  it('rejects within the timeout while the server is frozen, and hands back an acquire that lands late', async () => {
    const { redis, locks } = locker({ timeout: 300 });
    expect(await redis.ping()).toBe('PONG');
    node.pause();
    const started = performance.now();
    const late = await within(rejection(locks.tryAcquire('late', { ttl: 30_000 })), 3_000, 'tryAcquire');
    expectUnavailable(late);
    expect(late).toMatchObject({ key: 'late', message: `lock acquire failed for "late": Redis at 127.0.0.1:${node.port} did not answer within 300 ms` });
    const took = performance.now() - started;
    expect(took).toBeGreaterThanOrEqual(290);
    expect(took).toBeLessThan(1_000);
    node.resume();
    // The acquire queued in the frozen server is granted when it thaws; the locker releases it instead of leaving
    // the key held for its 30 s ttl.
    await takenOnceFree(locks, 'late', 'the late acquire to be handed back');
  });

  it('sends again a release of a nested lease that timed out, which drops that lease’s hold only once: the sibling keeps its hold', async () => {
    const prefix = uniquePrefix('nested-retry');
    const { redis, locks } = locker({ prefix, timeout: 200 });
    const outer = await locks.acquire('k', { owner: 'job' });
    const inner = await locks.acquire('k', { owner: 'job' });
    expect(inner.token).toBe(outer.token);
    node.pause();
    try {
      expectUnavailable(await within(rejection(outer.release()), 3_000, 'the release'));
      // Sent, so it runs once the server thaws; and sent again, which runs too.
      expect((outer as unknown as { retryTimer?: unknown }).retryTimer).toBeDefined();
    } finally {
      node.resume();
    }
    expect(await redis.ping()).toBe('PONG');
    await until(async () => (outer as unknown as { released: boolean }).released, 3_000, 'the release sent again to get through');
    await stillHolds(prefix, inner);
  });

  it('drops a nested lease’s hold once when ioredis sends its release again after a reconnect (it had run): the sibling keeps the lock', async () => {
    const prefix = uniquePrefix('resent-release');
    const { proxy, client, locks, close } = await proxied(prefix, {}, 2_000);
    const admin = locker({ prefix }).redis;
    const holds = async () => (await admin.get(lockNames(prefix, 'k').lock))?.split(' ')[2]?.split(',').length;
    try {
      const outer = await locks.acquire('k', { owner: 'job', ttl: 20_000 });
      const inner = await locks.acquire('k', { owner: 'job', ttl: 20_000 });
      expect(await holds()).toBe(2);
      const pass = proxy.holdReplies();
      const released = inner.release().catch(() => undefined);
      await until(async () => (await holds()) === 1, 2_000, 'the release to run');
      // The connection drops with its reply on the way: ioredis sends the release again on the next one (its
      // autoResendUnfulfilledCommands, on by default).
      // (ioredis sends a script again as EVAL, with its whole source.)
      const resent = Promise.race([proxy.sent('eval'), proxy.sent('evalsha')]);
      proxy.cut();
      pass();
      await within(resent, 3_000, 'ioredis to send the release again');
      await released;
      expect(await client.ping()).toBe('PONG');
      await stillHolds(prefix, outer);
    } finally {
      await close();
    }
  });

  it('adds a nested hold once when ioredis sends its acquire again after a reconnect (it had run): the key is free after both releases', async () => {
    const prefix = uniquePrefix('resent-acquire');
    const { proxy, client, locks, close } = await proxied(prefix, {}, 2_000);
    const admin = locker({ prefix }).redis;
    const names = lockNames(prefix, 'k');
    const holds = async () => (await admin.get(names.lock))?.split(' ')[2]?.split(',').length;
    try {
      const outer = await locks.acquire('k', { owner: 'job', ttl: 20_000 });
      const pass = proxy.holdReplies();
      const nested = locks.acquire('k', { owner: 'job', ttl: 20_000 }).catch(() => null);
      await until(async () => (await holds()) === 2, 2_000, 'the nested acquire to run');
      // (ioredis sends a script again as EVAL, with its whole source.)
      const resent = Promise.race([proxy.sent('eval'), proxy.sent('evalsha')]);
      proxy.cut();
      pass();
      await within(resent, 3_000, 'ioredis to send the acquire again');
      const inner = await nested;
      expect(await client.ping()).toBe('PONG');
      expect(await holds()).toBe(2);
      await inner?.release();
      expect(await outer.release()).toBe(true);
      await until(async () => (await admin.exists(names.lock)) === 0, 2_000, 'the key to be free');
    } finally {
      await close();
    }
  });

  it('does not release again, when a late hand-over confirms an heir whose own release was sent, a hold another process re-entered', async () => {
    const prefix = uniquePrefix('late-confirm');
    // Calls time out after 2 s: the heir's release must, and nothing else may, on a machine under load (at 1 s, an
    // acquire once timed out with the machine's both cores busy).
    const { proxy, client, locks, close } = await proxied(prefix, {}, 2_000);
    try {
      const releasing = await locks.acquire('k', { ttl: 10_000 });
      const waiting = locks.acquire('k', { owner: 'x', ttl: 10_000, wait: 5_000 });
      await until(async () => (await node.client().zcard(lockNames(prefix, 'k').queue)) === 1, 3_000, 'the heir to queue');
      // The release hands the lock to the heir in this process at once; Redis records it (TRANSFER), and its reply waits.
      const pass = proxy.holdReplies();
      void releasing.release().catch(() => undefined);
      const heir = await within(waiting, 3_000, 'the heir');
      // Another process re-enters under the same owner: two holds of the heir's token.
      const other = locker({ prefix }).locks;
      const reentered = await other.acquire('k', { owner: 'x', ttl: 10_000 });
      expect(reentered.token).toBe(heir.token);
      // The heir's release is sent, runs (one hold left, the other process's), and times out here.
      expectUnavailable(await within(rejection(heir.release()), 6_000, "the heir's release"));
      pass();
      // Twice: the first reply comes after TRANSFER's, the second after anything that reply set off.
      expect(await client.ping()).toBe('PONG');
      expect(await client.ping()).toBe('PONG');
      // The late TRANSFER reply confirms the heir, whose lease has ended: its hold is not dropped a second time.
      await stillHolds(prefix, reentered);
    } finally {
      await close();
    }
  });

  it('sends again, until the store would let it go, a release that could not be sent when a late hand-over confirmed its ended lease', async () => {
    const prefix = uniquePrefix('late-confirm-unsent');
    const { proxy, client, locks, close } = await proxied(prefix, {}, 300);
    const names = lockNames(prefix, 'k');
    try {
      const lease = await locks.acquire('k', { ttl: 300 });
      const record = await node.client().get(names.lock);
      // Lost by its time, as an heir is whose hand-over Redis recorded too slowly.
      await within(once(lease.signal, 'abort'), 3_000, 'the lease to be lost');
      // The late TRANSFER: Redis holds the lock under the lease's token for the heir's ttl.
      await node.client().set(names.lock, record!, 'PX', 10_000);
      proxy.cut();
      await once(client, 'close');
      // Its holder releases it while the client reconnects (not sent), and the hand-over's confirmation arrives then.
      const released = rejection(lease.release());
      (lease as unknown as { confirm(at: number): void }).confirm(lease.expiresAt + 10_000);
      expectUnavailable(await released);
      // Sent again once the client is back: the key does not stay held for the 10 s nobody can use.
      await until(async () => (await node.client().exists(names.lock)) === 0, 5_000, 'the release to be sent again');
    } finally {
      await close();
    }
  });

  it('records the hold of an owner’s acquire that tries again after a grant came too late, though another process re-entered meanwhile', async () => {
    const prefix = uniquePrefix('late-owner-retry');
    const { proxy, locks, close } = await proxied(prefix, {}, 2_000);
    const admin = locker({ prefix }).redis;
    const names = lockNames(prefix, 'k');
    try {
      // Its scripts loaded on this connection: the attempt is one EVALSHA.
      await (await locks.acquire('warm', { owner: 'O', ttl: 1_000 })).release();
      const pass = proxy.holdReplies();
      const sent = performance.now();
      const acquiring = locks.acquire('k', { owner: 'O', ttl: 200, wait: 5_000 });
      await until(async () => (await admin.exists(names.lock)) === 1, 2_000, 'the acquire to run');
      const other = await locker({ prefix }).locks.acquire('k', { owner: 'O', ttl: 5_000 });
      // Its grant arrives after its ttl (time has to pass: nothing else tells): handed back, and it tries again with
      // the same token, as the lock's holder.
      await new Promise((resolve) => setTimeout(resolve, Math.max(0, 300 - (performance.now() - sent))));
      pass();
      const lease = await within(acquiring, 3_000, 'the acquire');
      await other.release();
      // Its hold is recorded: the lock is still its own.
      expect(await locker({ prefix }).locks.tryAcquire('k', { owner: 'P' })).toBeNull();
      expect(lease.signal.aborted).toBe(false);
      expect(await lease.release()).toBe(true);
      expect(await admin.exists(names.lock)).toBe(0);
    } finally {
      await close();
    }
  });

  it('drops only its own hold when a waiter handed the lock gives up after another process of its owner re-entered', async () => {
    const prefix = uniquePrefix('leave-owner');
    const { proxy, client, locks, close } = await proxied(prefix, {}, 5_000);
    const admin = locker({ prefix }).redis;
    const names = lockNames(prefix, 'k');
    try {
      const holder = await locks.acquire('k', { owner: 'Q', ttl: 10_000 });
      const controller = new AbortController();
      const waiting = locks.acquire('k', { owner: 'O', ttl: 10_000, wait: 10_000, signal: controller.signal }).catch((e: unknown) => e);
      await waiterAsleep(proxy, client);
      // The release hands the lock to the waiter in Redis; the waiter then gives up with its LEAVE held on the way,
      // while another process of its owner re-enters.
      const passReplies = proxy.holdReplies();
      const released = holder.release();
      await until(async () => (await admin.get(names.lock))?.endsWith(' O') === true, 2_000, 'the hand-over to run');
      const passCommands = proxy.holdCommands();
      const leaving = Promise.race([proxy.sent('eval'), proxy.sent('evalsha')]);
      controller.abort(new Error('gave up'));
      await within(leaving, 2_000, 'the waiter to leave');
      const other = await locker({ prefix }).locks.acquire('k', { owner: 'O', ttl: 10_000 });
      passCommands();
      passReplies();
      await released;
      expect(await waiting).toMatchObject({ message: 'gave up' });
      expect(await client.ping()).toBe('PONG');
      // The other process's hold stays: another owner is refused, and its release frees the key.
      expect(await locker({ prefix }).locks.tryAcquire('k', { owner: 'P' })).toBeNull();
      expect(await other.release()).toBe(true);
      await until(async () => (await admin.exists(names.lock)) === 0, 2_000, 'the key to be free');
    } finally {
      await close();
    }
  });

  it('keeps the lock of an heir whose own attempt, sent before the hand-over and timed out, lands after it', async () => {
    const prefix = uniquePrefix('heir-late-attempt');
    const { proxy, client, locks, close } = await proxied(prefix, {}, 1_500);
    const admin = locker({ prefix }).redis;
    const names = lockNames(prefix, 'k');
    try {
      const holder = await locks.acquire('k', { owner: 'Q', ttl: 10_000 });
      const waiting = locks.acquire('k', { ttl: 10_000, wait: 10_000 });
      await waiterAsleep(proxy, client);
      const passReplies = proxy.holdReplies();
      const released = holder.release().catch(() => undefined);
      await until(async () => (await admin.get(names.lock))?.endsWith(' Q') === false, 2_000, 'the hand-over to run');
      // The waiter's next attempt (a poll) is held on its way; the hand-over's reply lets it in meanwhile.
      const passCommands = proxy.holdCommands();
      await within(proxy.sent('evalsha'), 3_000, 'the waiter to attempt again');
      passReplies();
      const lease = await within(waiting, 2_000, 'the heir');
      await released;
      // Its attempt times out (time has to pass), then runs, granting under the heir's own token.
      await new Promise((resolve) => setTimeout(resolve, 1_700));
      passCommands();
      expect(await client.ping()).toBe('PONG');
      expect(await client.ping()).toBe('PONG');
      expect(await locker({ prefix }).locks.tryAcquire('k')).toBeNull();
      expect(lease.signal.aborted).toBe(false);
      expect(await lease.release()).toBe(true);
    } finally {
      await close();
    }
  });

  it('gives back what a waiter takes with an attempt a dropped connection sent twice, once a release here named it heir but handed the lock elsewhere', async () => {
    const prefix = uniquePrefix('named-heir');
    // This process reaches Redis through the proxy and reconnects only after 600 ms; its calls time out after 150.
    const { proxy, client, locks, close } = await proxied(prefix, { retryStrategy: () => 600 }, 150);
    const other = locker({ prefix }).locks;
    const admin = locker({ prefix }).redis;
    const names = lockNames(prefix, 'k');
    try {
      // The holder is in this process, so its release names this process's waiter W as heir; but X (another process)
      // is first in Redis's line, and gets the lock.
      const holder = await locks.acquire('k', { ttl: 10_000 });
      const first = other.acquire('k', { wait: 8_000, ttl: 10_000 });
      await until(async () => (await admin.zcard(names.queue)) === 1, 2_000, 'X to queue');
      const w = locks.acquire('k', { wait: 8_000, ttl: 10_000 }).catch(() => null);
      await waiterAsleep(proxy, client);
      await holder.release();
      const x = await within(first, 3_000, 'X');
      // W's attempt on X's release goes out on a connection that drops before Redis reads it: ioredis sends it again
      // after reconnecting, and it takes the free key under W's token, which W (failed meanwhile) no longer wants.
      proxy.cutWhenSent(names.lock);
      await x.release();
      expect(await w).toBeNull();
      await until(
        async () => {
          const lease = await other.tryAcquire('k');
          await lease?.release();
          return lease !== null;
        },
        4_000,
        'the key to be free again',
      );
    } finally {
      await close();
    }
  });

  it('leaves the line again when a waiter’s attempt, sent again by ioredis after its call failed, queues it there', async () => {
    const prefix = uniquePrefix('ghost');
    // This process reaches Redis through the proxy and reconnects only after 600 ms; its calls time out after 150.
    const { proxy, client, locks, close } = await proxied(prefix, { retryStrategy: () => 600 }, 150);
    const other = locker({ prefix }).locks;
    const admin = locker({ prefix }).redis;
    const names = lockNames(prefix, 'k');
    try {
      const holder = await other.acquire('k', { ttl: 10_000 });
      // The waiter's attempt goes out on a connection that drops before Redis reads it: the call fails (its LEAVE
      // cannot be sent while the client reconnects), and ioredis sends the attempt again once it has, which puts the
      // waiter, gone by then, in the line.
      proxy.cutWhenSent(names.lock);
      expectUnavailable(await within(rejection(locks.acquire('k', { wait: 5_000 })), 3_000, 'the waiter'));
      await within(proxy.sent('eval'), 3_000, 'the attempt to go out again');
      // Sent after it on the same connection: once answered, Redis has run the attempt.
      expect(await client.ping()).toBe('PONG');
      await until(async () => (await admin.zcard(names.queue)) === 0, 2_000, 'the line to be empty again');
      await holder.release();
      // Nobody left in the line: the next caller gets the lock at once.
      expect(await other.tryAcquire('k')).not.toBeNull();
    } finally {
      await close();
    }
  });

  it.each(['before', 'after'] as const)(
    'keeps a lease handed over here when its own attempt fails and lands later, its token forgotten %s the timeout',
    async (when) => {
      const prefix = uniquePrefix(`handed-late-${when}`);
      const { proxy, client, locks, close } = await proxied(prefix, {}, 300);
      const other = locker({ prefix }).locks;
      const admin = locker({ prefix }).redis;
      const names = lockNames(prefix, 'k');
      // The store keeps the newest 1,024 tokens its releases handed the lock to: other hand-overs push one out.
      const store = (locks as unknown as { store: { noteHeir(token: string): void } }).store;
      const forget = () => {
        for (let i = 0; i < 1_100; i++) store.noteHeir(`filler-${i}`);
      };
      try {
        const a = await locks.acquire('k', { ttl: 20_000 });
        const waiting = locks.acquire('k', { ttl: 20_000, wait: 30_000 });
        await waiterAsleep(proxy, client);
        const [token] = await admin.zrange(names.queue, 0, -1);
        // B's next attempt (woken by hand) and A's release, which hands B the lock here, wait on their way to Redis.
        const letGo = proxy.holdCommands();
        const attempt = proxy.sent('evalsha');
        await admin.publish(`${names.lock}:w`, token!);
        await within(attempt, 2_000, 'the woken attempt');
        void a.release();
        const b = await within(waiting, 2_000, 'the hand-over here');
        if (when === 'before') forget();
        // B's attempt times out (300 ms): an unsure acquire, to give back were B's lease not live.
        await new Promise((resolve) => setTimeout(resolve, 450));
        if (when === 'after') forget();
        // Redis refuses the attempt (A holds), then runs the hand-over: the lock is B's, and stays B's.
        letGo();
        expect(await client.ping()).toBe('PONG');
        await new Promise((resolve) => setTimeout(resolve, 100));
        expect(b.signal.aborted).toBe(false);
        expect(await other.tryAcquire('k')).toBeNull();
        expect(await b.release()).toBe(true);
      } finally {
        await close();
      }
    },
  );

  it('gives back an unsure acquire of a waiter named heir once the release that named it answers the lock went elsewhere', async () => {
    const prefix = uniquePrefix('held-back');
    const { redis, locks } = locker({ prefix, timeout: 300 });
    const store = (locks as unknown as { store: Record<string, (...args: unknown[]) => unknown> }).store;
    const names = lockNames(prefix, 'k');
    // A release here named the waiter heir; the waiter's own acquire failed unsure, having taken the free key.
    const token = 'W'.repeat(22);
    await redis.set(names.lock, `${token} 1 1 0 `, 'PX', 10_000);
    store.noteHeir!.call(store, token);
    store.releaseUnsure!.call(store, token, { n: names, until: (store.now!.call(store) as number) + 10_000, hold: '' });
    // Put off while the lock may be the waiter's lease: the release has not answered.
    expect(await redis.ping()).toBe('PONG');
    expect(await redis.exists(names.lock)).toBe(1);
    // It answers that Redis gave the lock to someone else: the waiter's key goes back now, not at its ttl.
    store.notHandedTo!.call(store, token);
    await until(async () => (await redis.exists(names.lock)) === 0, 2_000, 'the put-off give-back');
  });

  it('drops an owner lease’s hold once, however often its release is sent (unsent, then timed out, then again): a re-entered hold stays', async () => {
    const prefix = uniquePrefix('owner-retry');
    // The client waits 400 ms between reconnect attempts: the unsent release's retry is due meanwhile.
    const { proxy, client, locks, close } = await proxied(prefix, { retryStrategy: () => 400 }, 100);
    try {
      const lease = await locks.acquire('k', { owner: 'o', ttl: 20_000 });
      const reentered = await locker({ prefix }).locks.acquire('k', { owner: 'o', ttl: 20_000 });
      expect(reentered.token).toBe(lease.token);
      proxy.cut();
      await once(client, 'close');
      // Unsent: hasp will send it again.
      expectUnavailable(await rejection(lease.release()));
      await once(client, 'ready');
      // The holder sends it again itself: it goes out, runs, and its reply is late; hasp sends it once more.
      const pass = proxy.holdReplies();
      expectUnavailable(await within(rejection(lease.release()), 3_000, 'the second release'));
      pass();
      expect(await client.ping()).toBe('PONG');
      await until(async () => (lease as unknown as { released: boolean }).released, 3_000, 'the release sent again to get through');
      await stillHolds(prefix, reentered);
    } finally {
      await close();
    }
  });

  it('hands back an acquire that ioredis failed on its own (commandTimeout) though Redis ran it: no key held by nobody', async () => {
    const redis = node.client({ commandTimeout: 100 });
    clients.push(redis);
    const prefix = uniquePrefix('cmd-timeout');
    const locks = new RedisLock(redis, { prefix });
    lockers.push(locks);
    expect(await redis.ping()).toBe('PONG');
    node.pause();
    try {
      // ioredis gives up after 100 ms, well within hasp's 2 s timeout: no late reply will reach hasp.
      const error = await within(rejection(locks.tryAcquire('k', { ttl: 30_000 })), 3_000, 'tryAcquire');
      expectUnavailable(error);
      expect(String((error as Error).message)).toContain('timed out');
    } finally {
      node.resume();
    }
    // The frozen server runs the acquire, then the release sent behind it on the same connection.
    expect(await redis.ping()).toBe('PONG');
    expect(await locker().redis.exists(lockNames(prefix, 'k').lock)).toBe(0);
  });

  it('hands back an acquire whose reply a dropped connection lost (maxRetriesPerRequest: 0), once the client is back', async () => {
    const prefix = uniquePrefix('unsure');
    const { proxy, locks, close } = await proxied(prefix, { maxRetriesPerRequest: 0 });
    try {
      // The acquire reaches Redis, which grants it; its reply is lost, and the connection drops.
      proxy.swallowRepliesAfter('eval(?:sha)?');
      const acquiring = rejection(locks.tryAcquire('k', { ttl: 30_000 }));
      await within(proxy.sent('eval(?:sha)?'), 3_000, 'the acquire to be sent');
      proxy.swallowRepliesAfter('no-such-command');
      proxy.cut();
      expectUnavailable(await within(acquiring, 3_000, 'tryAcquire'));
      // Released once the client has reconnected: the next caller gets in long before the 30 s ttl.
      const next = await locker({ prefix }).locks.acquire('k', { wait: 10_000 });
      expect(await next.release()).toBe(true);
    } finally {
      await close();
    }
  });

  it('hands back the hold of a same-owner (nested) acquire that lands late, so the outer release frees the key', async () => {
    const prefix = uniquePrefix('late-nested');
    const { redis, locks } = locker({ timeout: 300, prefix });
    const other = locker({ prefix }).locks;
    const outer = await locks.acquire('late-nested', { owner: 'job', ttl: 30_000 });
    expect(await redis.ping()).toBe('PONG');
    node.pause();
    expectUnavailable(await within(rejection(locks.tryAcquire('late-nested', { owner: 'job', ttl: 30_000 })), 3_000, 'the nested tryAcquire'));
    node.resume();
    // The nested acquire runs when the server thaws, adding a hold nobody has. A PING on the same connection is answered
    // after it: by then its late reply is in.
    expect(await redis.ping()).toBe('PONG');
    // The outer lease's release must still leave the key free (not held by nobody until its 30 s ttl).
    expect(await outer.release()).toBe(true);
    await takenOnceFree(other, 'late-nested', 'the key to be free once the late nested hold is handed back');
  });

  it('rejects an extension confirmed after the lease ended, and hands the lock back', async () => {
    const prefix = uniquePrefix('extend-late');
    const { locks } = locker({ prefix, timeout: 2_000 });
    const lost: string[] = [];
    const lease = await locker({ prefix, onError: (e) => void lost.push(e.operation) }).locks.acquire('k', { ttl: 600 });
    // Frozen just before the lease's end, so the extension is still on its way when the lease ends by our clock.
    await new Promise((resolve) => setTimeout(resolve, Math.max(0, lease.expiresAt - Date.now() - 80)));
    node.pause();
    const extension = rejection(lease.extend(10_000));
    try {
      expect(await abortReason(lease.signal, 2_000, 'the lease to end')).toBeInstanceOf(LockLostError);
    } finally {
      node.resume();
    }
    // Redis does extend the key by 10 s when it thaws; the holder was told the lease is lost, so that serves nobody.
    expect(await extension).toBeInstanceOf(LockLostError);
    expect(lost).toContain('lost');
    await takenOnceFree(locks, 'k', 'the lock to be handed back');
  });

  it('rejects a release within its own timeout while an extension is on its way to a frozen server', async () => {
    const prefix = uniquePrefix('release-bound');
    const { redis, locks } = locker({ prefix, timeout: 600 });
    const lease = await locks.acquire('k', { ttl: 30_000 });
    expect(await redis.ping()).toBe('PONG');
    node.pause();
    const extension = rejection(lease.extend());
    const started = performance.now();
    try {
      // Not the extension's 600 ms and then its own.
      expectUnavailable(await within(rejection(lease.release()), 3_000, 'release'));
      expect(performance.now() - started).toBeLessThan(1_000);
      expectUnavailable(await extension);
    } finally {
      node.resume();
    }
    // Both run when the server thaws, the extension first: the key ends up free, not extended for 30 s.
    await takenOnceFree(locker({ prefix }).locks, 'k', 'the release to run after the extension');
  });

  it('never hands out a lease whose ttl ran out while Redis was slow: it gives the key back, and tries again within wait', async () => {
    const prefix = uniquePrefix('late-grant');
    const { redis, locks } = locker({ prefix });
    const name = lockNames(prefix, 'k').lock;
    for (const wait of [0, 5_000]) {
      expect(await redis.ping()).toBe('PONG');
      node.pause();
      const acquiring = locks.acquire('k', { ttl: 400, wait }).then(
        (lease) => ({ lease, error: undefined }),
        (error: unknown) => ({ lease: undefined, error }),
      );
      // Frozen for longer than the ttl but not the 2 s timeout: Redis grants the lock when it thaws, 400 ms too late.
      await new Promise((resolve) => setTimeout(resolve, 700));
      node.resume();
      const { lease, error } = await within(acquiring, 3_000, 'the acquire');
      if (wait === 0) {
        expect(error).toBeInstanceOf(LockUnavailableError);
        expect(error).toMatchObject({ code: 'LOCK_UNAVAILABLE', message: expect.stringMatching(
            /^lock acquire failed for "k": it took \d+ ms, which with the [\d.]+ ms allowed for clock drift leaves nothing of the 400 ms ttl: the lease would have ended$/,
          ),
        });
        // Given back at once, not left held for its 400 ms.
        await until(async () => (await redis.exists(name)) === 0, 200, 'the late grant to be given back');
      } else {
        // A second attempt, within wait, got a lease that is live.
        expect(lease!.expiresAt).toBeGreaterThan(Date.now());
        expect(lease!.signal.aborted).toBe(false);
        expect(await lease!.release()).toBe(true);
      }
    }
  });

  it('settles an aborted acquire at once with the reason while its attempt waits on a frozen server, and gives back the late grant', async () => {
    const prefix = uniquePrefix('abort-flight');
    const { redis, locks } = locker({ prefix });
    const name = lockNames(prefix, 'k').lock;
    expect(await redis.ping()).toBe('PONG');
    node.pause();
    try {
      const controller = new AbortController();
      const acquiring = rejection(locks.acquire('k', { ttl: 30_000, wait: 5_000, signal: controller.signal }));
      // One turn of the event loop: the attempt has gone out, and waits on the frozen server.
      await new Promise((resolve) => setImmediate(resolve));
      const reason = new Error('the client went away');
      const aborted = performance.now();
      controller.abort(reason);
      expect(await within(acquiring, 1_000, 'the aborted acquire')).toBe(reason);
      expect(performance.now() - aborted).toBeLessThan(200);
    } finally {
      node.resume();
    }
    // The attempt runs as the server thaws and takes the lock for 30 s, for nobody: it is given back.
    expect(await redis.exists(name)).toBe(1);
    await until(async () => (await redis.exists(name)) === 0, 2_000, 'the late grant to be given back');
  });

  it('settles an aborted acquire at once while its subscription to wake-ups goes unanswered', async () => {
    const prefix = uniquePrefix('abort-listen');
    const { proxy, locks, close } = await proxied(prefix);
    try {
      const held = await locker({ prefix }).locks.acquire('k');
      // The waiter's SUBSCRIBE (on the wake-up connection, a copy of its client, through the proxy) is never answered.
      proxy.swallowRepliesAfter('subscribe');
      const controller = new AbortController();
      const acquiring = rejection(locks.acquire('k', { wait: 10_000, signal: controller.signal }));
      await within(proxy.sent('subscribe'), 3_000, 'the waiter to subscribe');
      const reason = new Error('the client went away');
      const aborted = performance.now();
      controller.abort(reason);
      // Not after the subscription's 2 s timeout.
      expect(await within(acquiring, 3_000, 'the aborted acquire')).toBe(reason);
      expect(performance.now() - aborted).toBeLessThan(200);
      expect(await held.release()).toBe(true);
    } finally {
      await close();
    }
  });

  it('keeps attempting while its subscription to wake-ups goes unanswered: wait is kept, and a release is found by polling', async () => {
    const prefix = uniquePrefix('deaf-sub');
    const { proxy, locks, close } = await proxied(prefix);
    try {
      const { redis: admin, locks: holder } = locker({ prefix });
      let held = await holder.acquire('k');
      // The waiter's SUBSCRIBE (on the wake-up connection, through the proxy) is never answered, as on a frozen node.
      proxy.swallowRepliesAfter('subscribe');
      const subscribing = proxy.sent('subscribe');
      const started = performance.now();
      const busy = await rejection(locks.acquire('k', { wait: 300 }));
      expect(busy).toMatchObject({ code: 'LOCK_BUSY' });
      await within(subscribing, 1_000, 'the waiter to subscribe');
      // Not after the subscription's 2 s timeout.
      expect(performance.now() - started).toBeLessThan(1_000);
      expect(await held.release()).toBe(true);

      held = await holder.acquire('k');
      const waiting = locks.acquire('k', { wait: 10_000 });
      await until(async () => (await admin.zcard(lockNames(prefix, 'k').queue)) === 1, 2_000, 'the waiter to join the line');
      const released = performance.now();
      expect(await held.release()).toBe(true);
      const lease = await within(waiting, 3_000, 'the waiter');
      // Found within a poll (50 ms while unsubscribed) and slack, not after the subscription timed out.
      expect(performance.now() - released).toBeLessThan(500);
      await lease.release();
    } finally {
      await close();
    }
  });

  it('gives back the hold of an aborted waiter whose late attempt re-enters a lock its owner took meanwhile, and leaves the line', async () => {
    const prefix = uniquePrefix('abort-nested');
    const names = lockNames(prefix, 'k');
    const admin = locker({ prefix }).redis;
    const { proxy, locks: slow, close } = await proxied(prefix);
    try {
      const held = await locker({ prefix }).locks.acquire('k', { owner: 'P' });
      // Two waiters of owner O, each on its own client: `first` ahead in the line, the other (through the proxy) behind.
      const first = locker({ prefix }).locks.acquire('k', { owner: 'O', wait: 10_000 });
      await until(async () => (await admin.zcard(names.queue)) === 1, 2_000, 'the first waiter to join the line');
      const subscribed = proxy.sent('subscribe');
      const controller = new AbortController();
      const waiting = rejection(slow.acquire('k', { owner: 'O', wait: 10_000, signal: controller.signal }));
      await within(subscribed, 2_000, 'the second waiter to listen');
      await until(async () => (await admin.zcard(names.queue)) === 2, 2_000, 'the second waiter to join the line');
      // From here the second waiter's commands are held on their way. The release wakes `first`, which takes the lock
      // for O; the second waiter, woken by hand (if its poll has not come first), attempts meanwhile and is aborted; then
      // its attempt lands and re-enters O's lock (a nested grant, handed back at once).
      const deliver = proxy.holdCommands();
      const attempted = proxy.sent('evalsha');
      await held.release();
      const outer = await within(first, 2_000, 'the first waiter');
      await admin.publish(names.channel, '');
      await within(attempted, 2_000, 'the woken waiter to attempt');
      controller.abort(new Error('gave up'));
      expect(await within(waiting, 1_000, 'the aborted acquire')).toMatchObject({ message: 'gave up' });
      deliver();
      // Left in the line, its place would come first once O releases, and hold up the next waiter.
      await until(async () => (await admin.zcard(names.queue)) === 0, 2_000, 'the aborted waiter to leave the line');
      // The nested hold goes back (after the attempt and the leave, which were held together): the outer lease's release
      // then frees the key, which a second hold would keep for 30 s.
      const holds = async () => (await admin.get(names.lock))?.split(' ')[2]?.split(',').length;
      await until(async () => (await holds()) === 1, 2_000, 'the nested grant to be handed back');
      expect(await outer.release()).toBe(true);
      expect(await admin.exists(names.lock)).toBe(0);
    } finally {
      await close();
    }
  });

  it.each([undefined, 'request-1'])('sends a release that met a network drop again once Redis is back (owner %s): the key is not refused for the rest of its ttl', async (owner) => {
    const prefix = uniquePrefix('release-retry');
    const { proxy, client, locks, close } = await proxied(prefix);
    try {
      const lease = await locks.acquire('k', { ttl: 30_000, owner });
      proxy.cut();
      await once(client, 'close');
      // While ioredis reconnects the release fails at once, and its holder is done with the key.
      await expect(lease.release()).rejects.toBeInstanceOf(LockUnavailableError);
      // The next holder is let in (woken by the release's message) once the client is back, not after the 30 s ttl.
      const next = await locker({ prefix }).locks.acquire('k', { wait: 10_000 });
      expect(await lease.release()).toBe(false);
      expect(await next.release()).toBe(true);
    } finally {
      await close();
    }
  });

  it('fails within the default 2 s timeout on a frozen server, well before ioredis gives up', async () => {
    const { redis, locks } = locker();
    expect(await redis.ping()).toBe('PONG');
    node.pause();
    const started = performance.now();
    expectUnavailable(await within(rejection(locks.acquire('frozen', { wait: 10_000 })), 4_000, 'acquire'));
    expect(performance.now() - started).toBeLessThan(3_000);
  });

  it('aborts the lease signal and reports extend failures when auto-extension cannot reach Redis', async () => {
    const events: LockErrorEvent[] = [];
    const { locks } = locker({ onError: (e) => events.push(e) });
    const outcome = await locks.using(
      'auto',
      async (lease) => {
        await node.kill();
        const reason = await abortReason(lease.signal, 3_000, 'the lease to be given up');
        expect(reason).toBeInstanceOf(LockLostError);
        return 'stopped';
      },
      { ttl: 600 },
    );
    // fn's outcome wins; the failed release is reported, not thrown. The extension's retries while the client
    // reconnects (they fail at once, ever faster as the lease runs out) are one event, not one per retry.
    expect(outcome).toBe('stopped');
    expect(events.map((e) => e.operation)).toEqual(['extend', 'lost', 'release']);
    // The loss says why: the last extension's failure (the one reported may be an earlier kind) is its cause.
    const lost = events[1]!.error;
    expect(lost.message).toMatch(/^lease on "auto" expired: its extension failed \(lock extend failed for "auto": Redis /);
    expectUnavailable(lost.cause);
    for (const e of events) {
      expect(e.key).toBe('auto');
      if (e.operation !== 'lost') expectUnavailable(e.error);
    }
  });

  it('reports a run of failed extensions once, and again after an extension got through in between', async () => {
    const events: LockErrorEvent[] = [];
    const { locks } = locker({ onError: (e) => events.push(e), timeout: 200 });
    const extends_ = () => events.filter((e) => e.operation === 'extend').length;
    await locks.using(
      'streak',
      async (lease) => {
        for (const run of [1, 2]) {
          // Frozen, each extension times out; thawed once the run is reported, a retry gets through.
          const before = lease.expiresAt;
          node.pause();
          await until(async () => extends_() === run, 5_000, `failure run ${run} to be reported`);
          node.resume();
          await until(async () => lease.expiresAt > before, 5_000, `an extension to get through after run ${run}`);
        }
        expect(lease.signal.aborted).toBe(false);
      },
      { ttl: 1_500 },
    );
    expect(events.map((e) => e.operation)).toEqual(['extend', 'extend']);
  });

  it('sends again the release of a lease that ended while its extension was on its way, while Redis holds the key by it', async () => {
    const prefix = uniquePrefix('late-extension-release');
    const options = { maxRetriesPerRequest: 0, autoResendUnfulfilledCommands: false, retryStrategy: () => 100 };
    const { proxy, locks, close } = await proxied(prefix, options, 2_000);
    const other = locker({ prefix }).locks;
    const names = lockNames(prefix, 'k');
    try {
      const lease = await locks.acquire('k', { ttl: 1_000 });
      const letReplies = proxy.holdReplies();
      const extended = Promise.race([proxy.sent('eval'), proxy.sent('evalsha')]);
      const extension = lease.extend(20_000).catch(() => undefined);
      await within(extended, 2_000, 'the extension to go out');
      await abortReason(lease.signal, 3_000, 'the lease to run out');
      // The extension's reply comes after the lease ended; the release it sets off is lost with the connection.
      proxy.cutWhenSent(names.lock);
      letReplies();
      await extension;
      // Sent again once the client is back, though the lease's own end has passed: Redis holds the key for 20 s.
      await until(async () => {
        const next = await other.tryAcquire('k');
        await next?.release();
        return next !== null;
      }, 3_000, 'the key to be free', 50);
    } finally {
      await close();
    }
  });

  it('settles using() only once the key is free when a lost lease’s last extension reached Redis late', async () => {
    const prefix = uniquePrefix('using-late-extension');
    const { proxy, locks, close } = await proxied(prefix);
    const other = locker({ prefix }).locks;
    let letGoLater: (() => void) | undefined;
    try {
      await within(
        locks.using(
          'k',
          async (lease) => {
            const first = lease.expiresAt;
            // The first auto-extension (at half the ttl) reaches Redis 400 ms after it was sent: Redis keeps the key a
            // ttl from then, longer than the lease counts (from before it was sent)... (A 2 s ttl: with 1 s, a loaded
            // machine's late timers let the reply come after the lease had ended by its clock, which nothing extends.)
            const letGo = proxy.holdCommands();
            await within(Promise.race([proxy.sent('eval'), proxy.sent('evalsha')]), 2_000, 'the extension');
            await new Promise((resolve) => setTimeout(resolve, 400));
            letGo();
            // ... and nothing after it gets there (held from the same moment, so no later extension slips through): the
            // lease runs out by its own clock, and its release hangs.
            letGoLater = proxy.holdCommands();
            await until(() => lease.expiresAt > first, 2_000, 'the extension’s reply');
            await abortReason(lease.signal, 5_000, 'the lease to run out');
          },
          { ttl: 2_000 },
        ),
        8_000,
        'using',
      );
      expect(await other.tryAcquire('k')).not.toBeNull();
    } finally {
      letGoLater?.();
      await close();
    }
  });

  it('settles using() of a lease handed over here, lost before Redis recorded the hand-over, only once the key is free', async () => {
    const prefix = uniquePrefix('using-heir');
    const { proxy, client, locks, close } = await proxied(prefix, {}, 8_000);
    const other = locker({ prefix }).locks;
    let letGo: (() => void) | undefined;
    try {
      const a = await locks.acquire('k', { ttl: 20_000 });
      let onLost!: () => void;
      const lost = new Promise<void>((resolve) => (onLost = resolve));
      let settled = false;
      const using = locks.using(
        'k',
        async (lease) => {
          await abortReason(lease.signal, 5_000, 'the heir’s lease to run out');
          onLost();
        },
        { ttl: 1_000, wait: 10_000 },
      );
      void using.then(() => (settled = true));
      await waiterAsleep(proxy, client);
      // A's release hands the lock to the waiter here; its TRANSFER (and all after it) waits on its way to Redis, which
      // holds the key under A's token, for A's 20 s.
      letGo = proxy.holdCommands();
      void a.release();
      await within(lost, 5_000, 'the heir’s lease to be lost');
      // Its own reckoning (a 1 s ttl) says nothing of A's: using waits on the release.
      await new Promise((resolve) => setTimeout(resolve, 200));
      expect(settled).toBe(false);
      letGo();
      await within(using, 5_000, 'using');
      expect(await other.tryAcquire('k')).not.toBeNull();
    } finally {
      letGo?.();
      await close();
    }
  });

  it('settles using() once fn does when its lease is lost, rather than wait out the release on a frozen server', async () => {
    const events: LockErrorEvent[] = [];
    const { redis, locks } = locker({ timeout: 4_000, onError: (e) => events.push(e) });
    expect(await redis.ping()).toBe('PONG');
    let returned = 0;
    const outcome = await within(
      locks.using(
        'frozen-using',
        async (lease) => {
          node.pause();
          expect(await abortReason(lease.signal, 6_000, 'the lease to be lost')).toBeInstanceOf(LockLostError);
          returned = performance.now();
          return 'stopped';
        },
        { ttl: 300 },
      ),
      10_000,
      'using',
    );
    // Awaiting the release would take its 4 s timeout here.
    expect(performance.now() - returned).toBeLessThan(1_500);
    expect(outcome).toBe('stopped');
    expect(events.map((e) => e.operation)).toContain('lost');
  });
});

describe('RedisLock keys, channels and line', () => {
  let node: RedisNode;
  let admin: Redis;

  beforeAll(async () => {
    node = await startRedis();
    admin = node.client();
  });

  it('writes only keys and channels under its prefix, whatever the key', async () => {
    await node.flush();
    const prefix = uniquePrefix('ns');
    const a = new RedisLock(node.client(), { prefix });
    const b = new RedisLock(node.client(), { prefix });
    const keys = HOSTILE_KEYS;
    const held = [];
    for (const key of keys) {
      const lease = await a.acquire(key, { ttl: 10_000 });
      // A waiter creates the queue keys and the wake-up channel too.
      const waiter = b.acquire(key, { wait: 5_000 });
      waiter.catch(() => undefined);
      held.push({ lease, waiter });
    }
    // Each key has its lock, fence, queue and deadlines once its waiter has queued; its channel once it subscribed.
    await until(async () => (await admin.dbsize()) >= keys.length * 4, 5_000, 'every waiter to queue');
    await until(
      async () => ((await admin.pubsub('CHANNELS')) as string[]).length >= keys.length,
      5_000,
      'every waiter to subscribe',
    );
    const all = await admin.keys('*');
    for (const name of all) expect(name.startsWith(prefix), name.slice(0, 80)).toBe(true);
    const channels = (await admin.pubsub('CHANNELS')) as string[];
    for (const channel of channels) expect(channel.startsWith(prefix), channel.slice(0, 80)).toBe(true);

    for (const { lease, waiter } of held) {
      await lease.release();
      await (await waiter).release();
    }
    a.close();
    b.close();
  });

  it('stores a key longer than 128 characters under a digest: its names stay short, and long keys stay apart', async () => {
    const prefix = uniquePrefix('long');
    const locks = new RedisLock(node.client(), { prefix });
    const long = 'k'.repeat(100_000);
    // Long keys differing only at the end, the longest key kept as it is, and a short key shaped like a digest.
    const keys = [long, `${long}x`, 'k'.repeat(129), 'k'.repeat(128), `%#${'a'.repeat(43)}`];
    const leases = await Promise.all(keys.map((k) => locks.acquire(k, { ttl: 10_000 })));
    for (const k of keys) {
      for (const name of Object.values(lockNames(prefix, k))) expect(name.length).toBeLessThanOrEqual(prefix.length + 134);
    }
    expect(await admin.exists(lockNames(prefix, long).lock)).toBe(1);
    // The fence key outlives the lock by an hour: a client sending a long key per request must not fill Redis with them.
    expect(Number(await admin.memory('USAGE', lockNames(prefix, long).fence))).toBeLessThan(200);
    expect(await locks.tryAcquire(long)).toBeNull();
    expect(await locks.tryAcquire(`${long}x`)).toBeNull();
    for (const lease of leases) expect(await lease.release()).toBe(true);
    locks.close();
  });

  it('gives distinct keys distinct Redis names, none of them another key’s name, on the wire too', () => {
    for (const prefix of ['hasp:lock:', '', '{', 'p}']) {
      const names = HOSTILE_KEYS.flatMap((key) => Object.values(lockNames(prefix, key)));
      // What ioredis sends: UTF-8 bytes (a lone surrogate would become U+FFFD and collide).
      const wire = new Set(names.map((n) => Buffer.from(n, 'utf8').toString('base64')));
      expect(wire.size).toBe(HOSTILE_KEYS.length * 5);
      for (const n of names) expect(n.startsWith(prefix)).toBe(true);
    }
  });

  it('keeps a key shaped like another key’s internal name apart from it', async () => {
    await node.flush();
    const prefix = uniquePrefix('shape');
    const locks = new RedisLock(node.client(), { prefix });
    const a = await locks.acquire('a');
    const before = new Set(await admin.keys('*'));
    const forged = await locks.acquire('a}:f');
    const added = (await admin.keys('*')).filter((k) => !before.has(k));
    // 'a}:f' gets names of its own (its lock and fence); none of 'a''s names was touched or reused.
    expect(added.length).toBeGreaterThanOrEqual(2);
    for (const name of added) expect(before.has(name)).toBe(false);
    expect(await admin.type([...before].find((k) => k.endsWith(':f'))!)).toBe('string');
    expect(await a.release()).toBe(true);
    expect(await forged.release()).toBe(true);
    locks.close();
  });

  it('lets a waiter in once a waiter ahead of it that went away has not asked for the free lock within the grace', async () => {
    const prefix = uniquePrefix('ghost');
    const names = lockNames(prefix, 'k');
    // A waiter whose process died while first in line for a free lock: its place would last another 10 s.
    const [secs, micros] = await admin.time();
    const now = Number(secs) * 1e6 + Number(micros);
    await admin.zadd(names.queue, now - 1_000, 'gone');
    await admin.hset(names.deadlines, 'gone', now + 10_000_000);
    const locks = new RedisLock(node.client(), { prefix });
    const started = performance.now();
    const lease = await locks.acquire('k', { wait: 10_000 });
    const waited = performance.now() - started;
    // Its first attempt found the lock free and gave those ahead FREE_HEAD_GRACE_MS to ask; a poll after that got in.
    expect(waited).toBeGreaterThan(FREE_HEAD_GRACE_MS - 100);
    expect(waited).toBeLessThan(FREE_HEAD_GRACE_MS + 2_000);
    expect(await admin.zscore(names.queue, 'gone')).toBeNull();
    await lease.release();
    locks.close();
  });

  it('clears a crashed process’s lapsed places at most FIRST_LIVE_SWEEP per call, refusing a newcomer until they are gone and letting a waiter behind them in soon', async () => {
    const prefix = uniquePrefix('lapsed');
    const names = lockNames(prefix, 'k');
    // 2.5 sweeps of places whose deadlines have passed, ahead of everyone.
    const lapsed = Math.floor(FIRST_LIVE_SWEEP * 2.5);
    const line = admin.pipeline();
    for (let i = 0; i < lapsed; i++) {
      line.zadd(names.queue, i + 1, `gone${i}`);
      line.hset(names.deadlines, `gone${i}`, 1);
    }
    line.pexpire(names.queue, 60_000);
    line.pexpire(names.deadlines, 60_000);
    await line.exec();
    const locks = new RedisLock(node.client(), { prefix });
    const left: number[] = [];
    let lease: Lease | null = null;
    for (let call = 0; call < 5 && lease === null; call++) {
      lease = await locks.tryAcquire('k');
      left.push(await admin.zcard(names.queue));
    }
    // Each refused call cleared one sweep; the one that found the line empty got the lock.
    expect(left).toEqual([lapsed - FIRST_LIVE_SWEEP, lapsed - 2 * FIRST_LIVE_SWEEP, 0]);
    expect(lease).not.toBeNull();
    await lease!.release();
    // A waiter behind such places asks again at once rather than sleep a poll (1 s) per sweep: behind ten sweeps' worth
    // it gets in within a few hundred ms (each sweep a few ms of Redis), where polls would take about eight seconds.
    const seed = admin.pipeline();
    for (let i = 0; i < 10 * FIRST_LIVE_SWEEP; i++) {
      seed.zadd(names.queue, i + 1, `gone${i}`);
      seed.hset(names.deadlines, `gone${i}`, 1);
    }
    await seed.exec();
    const started = performance.now();
    const waited = await locks.acquire('k', { wait: 10_000 });
    expect(performance.now() - started).toBeLessThan(3_000);
    expect(await admin.zcard(names.queue)).toBe(0);
    await waited.release();
    locks.close();
  });
});

describe('RedisLock waiters and the heap', () => {
  let node: RedisNode;
  const clients: Redis[] = [];
  const lockers: RedisLock[] = [];
  // A full collection on demand, without starting the test process with --expose-gc.
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;

  beforeAll(async () => {
    node = await startRedis();
  });

  afterEach(() => {
    for (const l of lockers.splice(0)) l.close();
    for (const c of clients.splice(0)) c.disconnect();
  });

  it('lets go of an aborted waiter at once (its abort reason may hold a request), not 2 × timeout later', async () => {
    const prefix = uniquePrefix('heap-abort');
    const client = node.client();
    clients.push(client);
    const locks = new RedisLock(client, { prefix, timeout: 10_000 });
    lockers.push(locks);
    const holder = await locks.acquire('k', { ttl: 20_000 });
    const ref = await (async () => {
      const reason = { request: new Array(1_000).fill('x') };
      const controller = new AbortController();
      const waiting = locks.acquire('k', { wait: 10_000, signal: controller.signal }).catch((e: unknown) => e);
      await until(async () => (await node.client().zcard(lockNames(prefix, 'k').queue)) === 1, 3_000, 'the waiter to queue');
      controller.abort(reason);
      expect(await waiting).toBe(reason);
      return new WeakRef(reason);
    })();
    await until(
      () => {
        gc();
        return Promise.resolve(ref.deref() === undefined);
      },
      3_000,
      'the abort reason to be collected',
    );
    await holder.release();
  });
});

describe('RedisLock hand-overs Redis refuses', () => {
  let node: RedisNode;
  let admin: Redis;
  let locks: RedisLock;
  let other: RedisLock;
  let names: ReturnType<typeof lockNames>;

  beforeEach(async () => {
    node = await startRedis();
    admin = node.client();
    const prefix = uniquePrefix('refused-handover');
    names = lockNames(prefix, 'k');
    locks = new RedisLock(node.client(), { prefix, ttl: 8_000 });
    other = new RedisLock(node.client(), { prefix });
  });
  afterEach(async () => {
    locks.close();
    other.close();
    await node.stop();
  });

  // Redis refuses every write while it is a replica (READONLY), the hand-over's TRANSFER script included.
  const refuse = () => admin.replicaof('127.0.0.1', '1');
  const recover = () => admin.replicaof('NO', 'ONE');
  /**
   * `count` waiters of `locks` on 'k', queued and each knowing who is ahead of it, so a release hands the lock down; the
   * first also subscribed and done with its early attempts (see refusalCounter), any of which would fail on a Redis
   * refusing writes and take it out of the line.
   */
  const localWaiters = async (count: number): Promise<Promise<Lease>[]> => {
    const waiting: Promise<Lease>[] = [];
    type Local = Map<string, { ahead?: Set<string> | null }[]>;
    const local = (locks as unknown as { store: { local: Local } }).store.local;
    const refusals = refusalCounter(locks);
    for (let i = 0; i < count; i++) {
      waiting.push(locks.acquire('k', { wait: 10_000 }));
      await until(() => local.get('k')?.[i]?.ahead?.size === i, 3_000, `waiter ${i} to know who is ahead of it`);
      // The first subscribes the channel; the others find it subscribed and sleep (a second's poll at most).
      if (i === 0) await refusals.settled('k', 'the first waiter', admin, names.channel);
    }
    return waiting;
  };
  /** The key is free: released, and nobody left in its line ahead of a newcomer. */
  const free = async (): Promise<void> => {
    const next = await other.tryAcquire('k');
    expect(next).not.toBeNull();
    await next!.release();
  };

  it('lets the heir hold, extend and release under the releasing token: the key is free once it releases', async () => {
    const first = await locks.acquire('k');
    const [waiting] = await localWaiters(1);
    await refuse();
    expect(await first.release()).toBe(true);
    const heir = await waiting!;
    expect(heir.fence).toBe(first.fence + 1);
    // Redis did not record the hand-over: the lock is still under the first lease's token, now the heir's.
    expect((await admin.get(names.lock))?.startsWith(`${first.token} `)).toBe(true);
    await recover();
    await heir.extend(20_000);
    expect(heir.signal.aborted).toBe(false);
    expect(await admin.pttl(names.lock)).toBeGreaterThan(15_000);
    expect(await other.tryAcquire('k')).toBeNull();
    expect(await heir.release()).toBe(true);
    expect(await admin.exists(names.lock)).toBe(0);
    await free();
  });

  it('frees the key once Redis recovers when the heir releases at once, before the refusal came back', async () => {
    const first = await locks.acquire('k');
    const [waiting] = await localWaiters(1);
    await refuse();
    const released = first.release();
    const heir = await waiting!;
    // Sent right behind the TRANSFER: refused as well, and sent again in the background.
    const heirReleased = heir.release().catch((e: unknown) => e);
    expect(await released).toBe(true);
    expect(await heirReleased).toBeInstanceOf(LockUnavailableError);
    await recover();
    await until(async () => (await admin.exists(names.lock)) === 0, 3_000, 'the heir’s release to get through');
    await free();
  });

  it('passes the lock down a chain of heirs while Redis refuses: the last one extends and releases it', async () => {
    const first = await locks.acquire('k');
    const [w1, w2] = await localWaiters(2);
    await refuse();
    const released = first.release();
    const h1 = await w1!;
    const handedOn = h1.release();
    const h2 = await w2!;
    expect(h2.fence).toBe(h1.fence + 1);
    expect(await released).toBe(true);
    expect(await handedOn).toBe(true);
    await recover();
    await h2.extend(20_000);
    expect(await admin.pttl(names.lock)).toBeGreaterThan(15_000);
    expect(await h2.release()).toBe(true);
    expect(await admin.exists(names.lock)).toBe(0);
    // The first heir is still in the line (its hand-over, which would have taken it out, never ran): its place holds
    // the next caller up for the line's grace, not for the first lease's ttl (8 s).
    const next = await other.acquire('k', { wait: 5_000 });
    await next.release();
  });

  it('hands over within the process, in the order they came, to waiters whose calls shared one command', async () => {
    let holder = await locks.acquire('k');
    type Local = Map<string, { token: string; ahead?: Set<string> | null }[]>;
    const local = (locks as unknown as { store: { local: Local } }).store.local;
    // Made in one callback: their first attempts go out merged, and Redis reads one clock for all of them.
    const waiting = Array.from({ length: 8 }, () => locks.acquire('k', { wait: 10_000 }));
    await until(() => {
      const line = local.get('k') ?? [];
      return line.length === 8 && line.every((w) => w.ahead instanceof Set);
    }, 3_000, 'the waiters to know who is ahead of them');
    const order = local.get('k')!.map((w) => w.token);
    expect(await admin.zrange(names.queue, 0, -1)).toEqual(order);
    for (const [i, next] of waiting.entries()) {
      void holder.release();
      const heir = await within(next, 3_000, `waiter ${i}`);
      // Let in within the process, in the order of the calls: the next fence, not the server clock's.
      expect(heir.fence).toBe(holder.fence + 1);
      holder = heir;
    }
    expect(await holder.release()).toBe(true);
    await free();
  });

  it('keeps handing over within the process down a long chain while Redis records each hand-over (no cover piles up)', async () => {
    const count = 24;
    let holder = await locks.acquire('k');
    // Sixteen in line at a time (a waiter learns who is ahead of it when at most sixteen are), topped up as they go.
    const waiting = await localWaiters(16);
    type Local = Map<string, { ahead?: Set<string> | null }[]>;
    const local = (locks as unknown as { store: { local: Local } }).store.local;
    const client = (locks as unknown as { store: { client: Redis } }).store.client;
    for (let i = 0; i < count; i++) {
      if (i + 16 < count) {
        waiting.push(locks.acquire('k', { wait: 10_000 }));
        await until(() => {
          const line = local.get('k') ?? [];
          return line[line.length - 1]?.ahead?.size === line.length - 1;
        }, 3_000, `waiter ${i + 16} to know who is ahead of it`);
      }
      void holder.release();
      const heir = await waiting[i]!;
      // Let in within the process: the next fence, not the server clock's.
      expect(heir.fence).toBe(holder.fence + 1);
      // Recorded in Redis, and its reply read here (it came before this PING's).
      await until(async () => (await admin.get(names.lock))?.startsWith(`${heir.token} `) === true, 2_000, `hand-over ${i} recorded`);
      await client.ping();
      holder = heir;
    }
    expect(await holder.release()).toBe(true);
    await free();
  });

  it('sends the hand-over after sixteen unrecorded ones through Redis, which frees the key once it recovers', async () => {
    const count = 17;
    const first = await locks.acquire('k');
    const waiting = await localWaiters(count);
    waiting[count - 1]!.catch(() => undefined);
    await refuse();
    let holder = first;
    for (let i = 0; i < count - 1; i++) {
      void holder.release().catch(() => undefined);
      holder = await waiting[i]!;
    }
    // The sixteenth heir's cover is full: its release goes to Redis, which refuses it (it is sent again later).
    expect(await rejection(holder.release())).toBeInstanceOf(LockUnavailableError);
    await recover();
    const last = await waiting[count - 1]!;
    expect(last.signal.aborted).toBe(false);
    expect(await last.release()).toBe(true);
    expect(await admin.exists(names.lock)).toBe(0);
  });

  it('covers the last heir of a chain whose first hand-over Redis ran and whose second it refused', async () => {
    const proxy = await startProxy(node.port);
    const via = new Redis({ host: '127.0.0.1', port: proxy.port });
    const prefix = uniquePrefix('refused-chain');
    const chainNames = lockNames(prefix, 'k');
    const chained = new RedisLock(via, { prefix, ttl: 8_000 });
    const outsider = new RedisLock(node.client(), { prefix });
    try {
      type Local = Map<string, { ahead?: Set<string> | null }[]>;
      const local = (chained as unknown as { store: { local: Local } }).store.local;
      const first = await chained.acquire('k');
      const waiting: Promise<Lease>[] = [];
      for (let i = 0; i < 2; i++) {
        waiting.push(chained.acquire('k', { wait: 10_000 }));
        await until(() => local.get('k')?.[i]?.ahead?.size === i, 3_000, `waiter ${i} to know who is ahead of it`);
      }
      // The first hand-over runs, but its reply is held: the process does not know yet.
      const pass = proxy.holdReplies();
      const released = first.release();
      const h1 = await waiting[0]!;
      await until(async () => (await admin.get(chainNames.lock))?.startsWith(`${h1.token} `) === true, 2_000, 'the first hand-over to run');
      // Every error reply counts: Redis 6 counts a write refused inside a script as the script's error, not as READONLY.
      const readOnly = async () => Number(/total_error_replies:(\d+)/.exec(await admin.info('stats'))?.[1] ?? 0);
      const refusals = await readOnly();
      await refuse();
      // The second is refused: the lock stays under the first heir's token, which the last heir's cover must name.
      const handedOn = h1.release();
      const h2 = await waiting[1]!;
      await until(async () => (await readOnly()) > refusals, 2_000, 'the second hand-over to be refused');
      await recover();
      pass();
      expect(await released).toBe(true);
      expect(await handedOn).toBe(true);
      await h2.extend(20_000);
      expect(await admin.pttl(chainNames.lock)).toBeGreaterThan(15_000);
      expect(await h2.release()).toBe(true);
      expect(await admin.exists(chainNames.lock)).toBe(0);
      const next = await outsider.acquire('k', { wait: 5_000 });
      await next.release();
    } finally {
      chained.close();
      outsider.close();
      via.disconnect();
      await proxy.close();
    }
  });
});

describe('RedisLock holds of a lock with an owner', () => {
  let node: RedisNode;
  let admin: Redis;
  const clients: Redis[] = [];
  const lockers: RedisLock[] = [];

  beforeAll(async () => {
    node = await startRedis();
    admin = node.client();
  });
  afterEach(async () => {
    for (const l of lockers.splice(0)) l.close();
    for (const c of clients.splice(0)) c.disconnect();
  });
  afterAll(() => {
    admin.disconnect();
  });

  const locker = (prefix: string): RedisLock => {
    const client = node.client();
    const locks = new RedisLock(client, { prefix });
    clients.push(client);
    lockers.push(locks);
    return locks;
  };
  /** The lock's holds on the server: id → deadline (server ms; Infinity for one written without a deadline). */
  const holdsOf = async (prefix: string): Promise<Map<string, number>> => {
    const value = await admin.get(lockNames(prefix, 'k').lock);
    const holds = new Map<string, number>();
    for (const h of value?.split(' ')[2]?.split(',') ?? []) {
      const [id, deadline] = h.split(':');
      holds.set(id!, deadline === undefined ? Infinity : Number(deadline));
    }
    return holds;
  };
  const serverMs = async (): Promise<number> => {
    const [s, us] = await admin.time();
    return Number(s) * 1_000 + Math.floor(Number(us) / 1_000);
  };

  it('extends a nested lease’s own hold; one whose hold ended is lost though the lock is held, and the last release frees it', async () => {
    const prefix = uniquePrefix('own-deadline');
    const locks = locker(prefix);
    const outer = await locks.acquire('k', { owner: 'job', ttl: 10_000 });
    const inner = await locks.acquire('k', { owner: 'job', ttl: 2_000 });
    let holds = await holdsOf(prefix);
    expect(holds.size).toBe(2);
    const [outerId, innerId] = [...holds.keys()] as [string, string];
    const now = await serverMs();
    expect(holds.get(outerId)! - now).toBeGreaterThan(9_000);
    expect(holds.get(innerId)! - now).toBeLessThanOrEqual(2_000);

    await inner.extend(8_000);
    holds = await holdsOf(prefix);
    expect(holds.get(innerId)! - now).toBeGreaterThan(7_000);
    expect(holds.get(innerId)! - now).toBeLessThan(9_000);
    expect(holds.get(outerId)! - now).toBeGreaterThan(9_000); // the outer hold is its own

    // The inner hold's deadline passes on the server (behind the lease's back): extending it finds it ended.
    const value = (await admin.get(lockNames(prefix, 'k').lock))!;
    await admin.set(lockNames(prefix, 'k').lock, value.replace(`${innerId}:${holds.get(innerId)}`, `${innerId}:${now - 1}`), 'KEEPTTL');
    expect(await rejection(inner.extend())).toBeInstanceOf(LockLostError);
    await outer.extend();
    expect(await locker(prefix).tryAcquire('k', { owner: 'other' })).toBeNull();
    // The ended hold goes with the outer one's release, which frees the lock.
    expect(await outer.release()).toBe(true);
    expect(await admin.exists(lockNames(prefix, 'k').lock)).toBe(0);
  });

  it('lets the key expire with its latest hold: a release shortens it to the holds that remain', async () => {
    const prefix = uniquePrefix('latest-hold');
    const locks = locker(prefix);
    const long = await locks.acquire('k', { owner: 'job', ttl: 20_000 });
    const short = await locks.acquire('k', { owner: 'job', ttl: 3_000 });
    expect(await admin.pttl(lockNames(prefix, 'k').lock)).toBeGreaterThan(15_000);
    await long.release();
    const left = await admin.pttl(lockNames(prefix, 'k').lock);
    expect(left).toBeGreaterThan(0);
    expect(left).toBeLessThanOrEqual(3_000);
    await short.release();
    expect(await admin.exists(lockNames(prefix, 'k').lock)).toBe(0);
  });

  it('wakes the first waiter when a waiter handed the lock gives up and the hold left ends sooner than its own', async () => {
    const prefix = uniquePrefix('leave-sooner');
    const names = lockNames(prefix, 'k');
    const locks = locker(prefix);
    // The lock under one token with two holds of its owner: one for 10 s, one for 300 ms.
    const long = await locks.acquire('k', { owner: 'job', ttl: 10_000 });
    const short = await locks.acquire('k', { owner: 'job', ttl: 300 });
    const waiting = locker(prefix).acquire('k', { owner: 'other', wait: 5_000 });
    await until(async () => (await admin.zcard(names.queue)) === 1, 2_000, 'the waiter to queue');
    const sub = admin.duplicate();
    try {
      await sub.subscribe(names.channel);
      const woken = once(sub, 'message');
      // The long hold's acquire was a waiter's that a release here handed the lock to, and it gave up (the locker's
      // LEAVE with its token): its hold goes, and the lock now ends with the short one.
      await LEAVE.run(admin, [names.lock, names.queue, names.deadlines], [long.token]);
      expect(await admin.pttl(names.lock)).toBeLessThanOrEqual(300);
      const [, name] = (await within(woken, 2_000, 'a wake-up on the channel')) as [string, string];
      expect(name).toBe((await admin.zrange(names.queue, 0, 0))[0]);
    } finally {
      sub.disconnect();
    }
    const next = await waiting;
    expect(next.fence).toBeGreaterThan(short.fence);
    await next.release();
  });

  it('wakes no waiter for nested releases that leave the lock held past the waiter’s next poll', async () => {
    const prefix = uniquePrefix('no-storm');
    const names = lockNames(prefix, 'k');
    const locks = locker(prefix);
    const outer = await locks.acquire('k', { owner: 'job', ttl: 30_000 });
    const waiting = locker(prefix).acquire('k', { owner: 'other', wait: 10_000 });
    await until(async () => (await admin.zcard(names.queue)) === 1, 2_000, 'the waiter to queue');
    const sub = admin.duplicate();
    const heard: string[] = [];
    try {
      await sub.subscribe(names.channel);
      sub.on('message', (_channel: string, name: string) => heard.push(name));
      // Each nested hold ends after the outer one: its release brings the lock's end forward, to 30 s from now.
      for (let i = 0; i < 50; i++) {
        const inner = await locks.acquire('k', { owner: 'job', ttl: 40_000 });
        await inner.release();
      }
      // Messages arrive in order: once this one is heard, any wake-up published before it has been too.
      const marker = once(sub, 'message');
      await admin.publish(names.channel, 'marker');
      await within(marker, 2_000, 'the marker');
      expect(heard).toEqual(['marker']);
    } finally {
      sub.disconnect();
    }
    await outer.release();
    await (await waiting).release();
  });

  it('keeps a hold written without a deadline (an earlier version’s) for as long as the key lives', async () => {
    const prefix = uniquePrefix('no-deadline');
    const names = lockNames(prefix, 'k');
    const locks = locker(prefix);
    const lease = await locks.acquire('k', { owner: 'job', ttl: 5_000 });
    const value = (await admin.get(names.lock))!;
    const [token, fence, , waiters, ...owner] = value.split(' ');
    await admin.set(names.lock, [token, fence, 'abcdefgh', waiters, owner.join(' ')].join(' '), 'PX', 5_000);
    // Its hold is gone (rewritten away): the lease is lost, and the old-style hold keeps the key.
    expect(await rejection(lease.extend())).toBeInstanceOf(LockLostError);
    const nested = await locks.acquire('k', { owner: 'job', ttl: 1_000 });
    expect(nested.token).toBe(token);
    expect((await holdsOf(prefix)).get('abcdefgh')).toBe(Infinity);
    expect(await admin.pttl(names.lock)).toBeGreaterThan(3_000);
    expect(await nested.release()).toBe(true);
    expect(await admin.pttl(names.lock)).toBeGreaterThan(3_000);
    expect((await holdsOf(prefix)).size).toBe(1);
  });
});
