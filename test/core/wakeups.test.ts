// The pub/sub wake-up connection against a real redis-server: subscriptions made at any point of the subscriber's
// life take effect, so waiters are woken by messages rather than by the polling fallback.
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RedisLock, type Lease } from '../../packages/core/src/index.js';
import { lockNames } from '../../packages/core/src/lock/redis-store.js';
import { Wakeups } from '../../packages/core/src/redis/wakeups.js';
import { startProxy } from '../harness/proxy.js';
import { startRedis, stopAll, type RedisNode } from '../harness/redis.js';
import { trackUnhandled } from '../redlock/support.js';
import { rejection, uniquePrefix, until, within } from './helpers.js';

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

describe('Wakeups while the subscriber is not ready', () => {
  it('waits for its connection with one listener, however many channels are asked for, and subscribes them all after', async () => {
    const own = await startRedis();
    const warnings: Error[] = [];
    const onWarning = (warning: Error): void => void warnings.push(warning);
    process.on('warning', onWarning);
    const wakeups = new Wakeups(own.client(), 500);
    try {
      // A frozen server accepts the connection but never answers the handshake: the subscriber stays not ready.
      own.pause();
      const first = wakeups.listen('wake:0', () => undefined);
      first.catch(() => undefined);
      const sub = (wakeups as unknown as { subscriber: Redis }).subscriber;
      // (The first subscription starts its wait a few ticks later.)
      await new Promise((resolve) => setImmediate(resolve));
      const before = sub.listenerCount('ready');
      // Twice as many channels as Node's default listener limit, asked for twice: the first round times out.
      for (let round = 0; round < 2; round++) {
        const asked = Array.from({ length: 20 }, (_, i) => wakeups.listen(`wake:${round}:${i}`, () => undefined));
        for (const a of asked) a.catch(() => undefined);
        expect(sub.listenerCount('ready')).toBe(before);
        if (round === 0) await Promise.allSettled(asked);
      }
      expect(sub.listenerCount('ready')).toBe(before);
      own.resume();
      const channels = Array.from({ length: 20 }, (_, i) => `wake:1:${i}`);
      await until(async () => {
        const reply = (await own.client().pubsub('NUMSUB', ...channels)) as (string | number)[];
        return channels.every((_, i) => Number(reply[2 * i + 1]) === 1);
      }, 5_000, 'the second round of channels to be subscribed');
      expect(warnings.filter((w) => w.name === 'MaxListenersExceededWarning')).toEqual([]);
    } finally {
      own.resume();
      process.off('warning', onWarning);
      wakeups.close();
    }
  });
});

describe('Wakeups of many lockers on one client', () => {
  it("share one 'end' listener on the client, kept until the last locker closes; the client's end still closes each", async () => {
    const client = node.client();
    await client.ping();
    const warnings: Error[] = [];
    const onWarning = (warning: Error): void => void warnings.push(warning);
    process.on('warning', onWarning);
    try {
      const before = client.listenerCount('end');
      // More lockers than Node's default listener limit, as an app with a locker per module might make.
      const lockers = Array.from({ length: 15 }, () => new RedisLock(client, { prefix: uniquePrefix('many') }));
      expect(client.listenerCount('end')).toBe(before + 1);
      for (const locker of lockers.slice(1)) locker.close();
      expect(client.listenerCount('end')).toBe(before + 1);
      lockers[0]!.close();
      expect(client.listenerCount('end')).toBe(before);
      // The client's end wakes and closes every one of them.
      const wakeups = Array.from({ length: 12 }, () => new Wakeups(client, 2_000));
      const heard: string[] = [];
      await Promise.all(wakeups.map((w, i) => w.listen(`ending:${i}`, (message) => heard.push(message))));
      client.disconnect();
      await until(() => heard.length === 12, 2_000, 'every listener to be woken by the end');
      expect(heard.every((message) => message === '')).toBe(true);
      await expect(wakeups[0]!.listen('after', () => undefined)).rejects.toThrow(/closed/);
      expect(client.listenerCount('end')).toBe(before);
      expect(warnings.filter((w) => w.name === 'MaxListenersExceededWarning')).toEqual([]);
    } finally {
      process.off('warning', onWarning);
    }
  });
});

describe('Wake-ups shared by the lockers of one client', () => {
  it('use one subscriber connection; closing one locker leaves the others woken at once, the last closes it', async () => {
    const own = await startRedis();
    const admin2 = own.client();
    const pubsubClients = async (): Promise<number> =>
      String(await admin2.call('CLIENT', 'LIST', 'TYPE', 'pubsub'))
        .split('\n')
        .filter((line) => line.trim() !== '').length;
    const client = own.client();
    const holderClient = own.client();
    await Promise.all([client.ping(), holderClient.ping()]);
    const holder = new RedisLock(holderClient, { prefix: 'one:' });
    const holder2 = new RedisLock(holderClient, { prefix: 'two:' });
    // Two lockers on one client, as an app with a locker per module has (withLock shares one per client already).
    const first = new RedisLock(client, { prefix: 'one:' });
    const second = new RedisLock(client, { prefix: 'two:' });
    try {
      const leases = [await holder.acquire('a'), await holder.acquire('b'), await holder2.acquire('a')];
      const waiting = [first.acquire('a', { wait: 10_000 }), first.acquire('b', { wait: 10_000 }), second.acquire('a', { wait: 10_000 })];
      for (const w of waiting) w.catch(() => undefined);
      const channels = [lockNames('one:', 'a').channel, lockNames('one:', 'b').channel, lockNames('two:', 'a').channel];
      const listening = async (): Promise<boolean> => {
        const reply = (await admin2.pubsub('NUMSUB', ...channels)) as (string | number)[];
        return channels.every((_, i) => Number(reply[2 * i + 1]) === 1);
      };
      await until(listening, 3_000, 'the three waiters to listen');
      expect(await pubsubClients()).toBe(1);
      // The first locker closes: the second one's waiter is still woken by the release, well before its 1 s poll.
      first.close();
      const releasedAt = performance.now();
      await leases[2]!.release();
      const got = await within(waiting[2]!, 2_000, "the second locker's waiter");
      expect(performance.now() - releasedAt).toBeLessThan(500);
      await got.release();
      expect(await pubsubClients()).toBe(1);
      // The last locker closes its share: the connection goes.
      second.close();
      await until(async () => (await pubsubClients()) === 0, 3_000, 'the subscriber connection to close');
      await leases[0]!.release();
      await leases[1]!.release();
      // The first locker's waiters, without wake-ups, still get their locks by polling.
      for (const lease of await within(Promise.all(waiting.slice(0, 2)), 5_000, "the closed locker's waiters")) await lease.release();
    } finally {
      for (const l of [first, second, holder, holder2]) l.close();
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

describe('Wakeups across a server restart', () => {
  /** Resolves on `client`'s next `event`, failing the test if it does not come within `ms`. */
  const next = (client: Redis, event: string, ms = 10_000): Promise<void> =>
    within(new Promise<void>((resolve) => client.once(event, () => resolve())), ms, `the subscriber's '${event}'`);

  it('subscribes its channels again once the server is back, and wakes their listeners at once', async () => {
    const own = await startRedis();
    const wakeups = new Wakeups(own.client(), 2_000);
    try {
      // Each message the listener hears settles the next promise in line.
      const heard: ((message: string) => void)[] = [];
      const hear = (): Promise<string> => new Promise((resolve) => heard.push(resolve));
      let message = hear();
      await within(
        wakeups.listen('wake:again', (m) => heard.shift()?.(m)),
        3_000,
        'the subscription',
      );
      const sub = (wakeups as unknown as { subscriber: Redis }).subscriber;
      const back = next(sub, 'ready');
      await own.restart();
      await back;
      // A release published while the subscriber was away is lost: once subscribed again, the listener is told to look
      // now ('' = anyone may try) instead of at its next poll.
      expect(await within(message, 3_000, 'the wake-up after the reconnect')).toBe('');
      const publisher = own.client();
      expect(await publisher.pubsub('NUMSUB', 'wake:again')).toEqual(['wake:again', 1]);
      message = hear();
      await publisher.publish('wake:again', 'x');
      expect(await within(message, 2_000, 'the message after the reconnect')).toBe('x');
    } finally {
      wakeups.close();
    }
  });

  it.each(['quit', 'disconnect'] as const)(
    'closes when the client is %s-ed while the server is gone (ioredis emits no end then), so nothing reconnects',
    async (how) => {
      const own = await startRedis();
      const client = own.client();
      const wakeups = new Wakeups(client, 2_000);
      try {
        const heard: string[] = [];
        await within(wakeups.listen('wake:gone', (m) => heard.push(m)), 3_000, 'the subscription');
        const sub = (wakeups as unknown as { subscriber: Redis }).subscriber;
        const reconnecting = next(client, 'reconnecting');
        await own.kill();
        await reconnecting;
        if (how === 'quit') void client.quit().catch(() => undefined);
        else client.disconnect();
        // At the copy's next reconnect attempt (ioredis's default delays stay under 2 s), not after the idle close.
        await next(sub, 'end', 5_000);
        expect(wakeups.isClosed).toBe(true);
        expect(heard).toEqual(['']);
        expect(client.status).not.toBe('ready');
      } finally {
        wakeups.close();
        client.disconnect();
      }
    },
  );

  it('leaves no unhandled rejection when closed while the resubscription is unanswered', async () => {
    const own = await startRedis();
    const proxy = await startProxy(own.port);
    // Through a proxy that can cut the connection and lose the reply to the SUBSCRIBE sent after the reconnect. A short
    // disconnectTimeout: the closed connection gives up on that reply soon (the subscriber copies the option).
    const client = new Redis({ host: '127.0.0.1', port: proxy.port, disconnectTimeout: 100 });
    const wakeups = new Wakeups(client, 2_000);
    const unhandled = trackUnhandled();
    try {
      await within(wakeups.listen('wake:closing', () => undefined), 3_000, 'the subscription');
      const sub = (wakeups as unknown as { subscriber: Redis }).subscriber;
      proxy.swallowRepliesAfter('subscribe');
      // Closed right after the reconnect's 'ready', once the SUBSCRIBE sent then is on its way.
      const closed = new Promise<void>((resolve) =>
        sub.once('ready', () =>
          process.nextTick(() => {
            wakeups.close();
            resolve();
          }),
        ),
      );
      const ended = next(sub, 'end');
      proxy.cut();
      await within(closed, 10_000, 'the reconnect');
      await ended;
      // An unhandled rejection is reported once the microtasks of the tick that rejected have run: two turns cover it.
      await new Promise((resolve) => setImmediate(resolve));
      await new Promise((resolve) => setImmediate(resolve));
      expect(unhandled.reasons).toEqual([]);
    } finally {
      unhandled.stop();
      wakeups.close();
      client.disconnect();
      await proxy.close();
    }
  });
});

describe('Wakeups through the client’s own life', () => {
  const next = (client: Redis, event: string, ms = 10_000): Promise<void> =>
    within(new Promise<void>((resolve) => client.once(event, () => resolve())), ms, `the client's '${event}'`);
  const listening = (channel: string, count = 1) => async (): Promise<boolean> => (await numsub([channel]))[0] === count;
  /** Releases `lease`, and checks that its waiter gets the lock at once (woken by the release, not by a poll). */
  const handedOn = async (lease: Lease, waiting: Promise<Lease>, what: string): Promise<void> => {
    const releasedAt = performance.now();
    await lease.release();
    await (await within(waiting, 3_000, what)).release();
    expect(performance.now() - releasedAt).toBeLessThan(500);
  };

  it('subscribes the waiters of a locker made before its client ended and was connected again', async () => {
    const prefix = uniquePrefix('reconnected');
    const client = node.client();
    const locks = new RedisLock(client, { prefix });
    const holder = new RedisLock(node.client(), { prefix });
    const channel = lockNames(prefix, 'k').channel;
    try {
      let lease = await holder.acquire('k');
      let waiting = locks.acquire('k', { wait: 10_000 });
      await until(listening(channel), 3_000, 'the waiter to listen');
      await lease.release();
      await (await within(waiting, 3_000, 'the first waiter')).release();
      // The client's end closes its wake-ups; connect() brings the client back, and its lockers with it.
      await client.quit();
      await until(listening(channel, 0), 3_000, 'the subscriber to close with its client');
      await client.connect();
      lease = await holder.acquire('k');
      waiting = locks.acquire('k', { wait: 10_000 });
      await until(listening(channel), 3_000, 'the waiter to listen after the client came back');
      await handedOn(lease, waiting, 'the second waiter');
    } finally {
      locks.close();
      holder.close();
    }
  });

  it('opens a new subscriber when Redis drops its own while the client stays up, and its waiters listen there', async () => {
    const prefix = uniquePrefix('sub-dropped');
    // A client that does not reconnect by itself: the subscriber copies its retryStrategy, so a dropped one ends.
    const client = node.client({ retryStrategy: () => null });
    const locks = new RedisLock(client, { prefix });
    const holder = new RedisLock(node.client(), { prefix });
    const channel = lockNames(prefix, 'k').channel;
    try {
      const lease = await holder.acquire('k');
      const waiting = locks.acquire('k', { wait: 10_000 });
      waiting.catch(() => undefined);
      await until(listening(channel), 3_000, 'the waiter to listen');
      // As Redis does itself past the pub/sub output buffer limit.
      await admin.call('CLIENT', 'KILL', 'TYPE', 'pubsub');
      await until(listening(channel), 3_000, 'the waiter to listen on a new subscriber');
      expect(client.status).toBe('ready');
      // Woken by the release, not after the 1 s a subscribed waiter sleeps between attempts.
      await handedOn(lease, waiting, 'the waiter');
    } finally {
      locks.close();
      holder.close();
    }
  });

  it('subscribes a waiter that starts while the subscriber connection is reconnecting, instead of polling all its wait', async () => {
    const prefix = uniquePrefix('sub-reconnecting');
    const client = node.client();
    const locks = new RedisLock(client, { prefix });
    const holder = new RedisLock(node.client(), { prefix });
    try {
      // A subscriber connection exists (a first waiter came and went)...
      let lease = await holder.acquire('first');
      const first = locks.acquire('first', { wait: 10_000 });
      await until(listening(lockNames(prefix, 'first').channel), 3_000, 'the first waiter to listen');
      await lease.release();
      await (await within(first, 3_000, 'the first waiter')).release();
      // ...and Redis drops it; it reconnects by itself, and a waiter starts meanwhile.
      lease = await holder.acquire('k');
      const sub = (locks as unknown as { store: { wakeups: { wakeups: { subscriber: Redis } } } }).store.wakeups.wakeups.subscriber;
      const reconnecting = next(sub, 'reconnecting');
      await admin.call('CLIENT', 'KILL', 'TYPE', 'pubsub');
      await reconnecting;
      const store = (locks as unknown as { store: { attempt: (...args: unknown[]) => Promise<unknown> } }).store;
      const attempt = store.attempt.bind(store);
      let attempts = 0;
      store.attempt = (...args) => {
        attempts++;
        return attempt(...args);
      };
      const waiting = locks.acquire('k', { wait: 10_000 });
      waiting.catch(() => undefined);
      await until(listening(lockNames(prefix, 'k').channel), 3_000, 'the subscriber to be back');
      // Held 1 s more: a subscribed waiter sleeps until the release (or its 1 s poll); one whose subscription failed
      // polls every 50 ms, some twenty attempts.
      await new Promise((resolve) => setTimeout(resolve, 1_000));
      await lease.release();
      await (await within(waiting, 3_000, 'the waiter')).release();
      expect(attempts).toBeLessThanOrEqual(10);
    } finally {
      locks.close();
      holder.close();
    }
  });

  it('sends no SUBSCRIBE for subscriptions given up while its connection could not get ready', async () => {
    const own = await startRedis();
    const admin2 = own.client();
    const client = own.client();
    await Promise.all([admin2.ping(), client.ping()]);
    // Redis at maxclients: the subscriber connection is refused, and keeps trying.
    const info = String(await admin2.info('clients'));
    await admin2.config('SET', 'maxclients', /connected_clients:(\d+)/.exec(info)![1]!);
    const wakeups = new Wakeups(client, 20);
    try {
      for (let i = 0; i < 50; i++) await wakeups.listen(`wake:refused-${i}`, () => undefined).catch(() => undefined);
      const sub = (wakeups as unknown as { subscriber: Redis }).subscriber;
      const back = next(sub, 'ready');
      await admin2.config('SET', 'maxclients', '10000');
      await back;
      await new Promise((resolve) => setImmediate(resolve));
      expect(await admin2.pubsub('NUMSUB', 'wake:refused-0')).toEqual(['wake:refused-0', 0]);
      const stats = String(await admin2.info('commandstats'));
      expect(/cmdstat_subscribe:calls=(\d+)/.exec(stats)?.[1] ?? '0').toBe('0');
    } finally {
      wakeups.close();
      client.disconnect();
      admin2.disconnect();
      await own.stop();
    }
  });

  it('gives up a SUBSCRIBE that a ready connection never answers within its timeout, and keeps no listener', async () => {
    const own = await startRedis();
    const proxy = await startProxy(own.port);
    const client = new Redis({ host: '127.0.0.1', port: proxy.port });
    client.on('error', () => undefined);
    await client.ping();
    const wakeups = new Wakeups(client, 200);
    try {
      (await within(wakeups.listen('wake:warm', () => undefined), 3_000, 'the first subscription'))();
      // The connection is ready, and its replies stop (a half-open socket, a paused Redis).
      const pass = proxy.holdReplies();
      const listens = Array.from({ length: 5 }, () => rejection(wakeups.listen('wake:frozen', () => undefined)));
      for (const error of await within(Promise.all(listens), 2_000, 'the subscriptions to give up')) {
        expect(String((error as Error).message)).toMatch(/within 200 ms/);
      }
      const channel = (wakeups as unknown as { channels: Map<string, { listeners: Set<unknown> }> }).channels.get('wake:frozen');
      expect(channel?.listeners.size ?? 0).toBe(0);
      pass();
    } finally {
      wakeups.close();
      client.disconnect();
      await proxy.close();
      await own.stop();
    }
  });

  it.each(['quit', 'disconnect'] as const)(
    'closes when the client is %s-ed while only its own connection is down (the subscriber fine, ioredis emits no end)',
    async (how) => {
      // A long reconnect delay: the client is still waiting to reconnect when it is closed.
      const client = node.client({ retryStrategy: () => 2_000 });
      const wakeups = new Wakeups(client, 2_000);
      try {
        await within(wakeups.listen('wake:own-conn', () => undefined), 3_000, 'the subscription');
        const reconnecting = next(client, 'reconnecting');
        // As Redis's idle `timeout` does: it closes normal connections, never pub/sub ones.
        await admin.call('CLIENT', 'KILL', 'ID', String(await client.call('CLIENT', 'ID')));
        await reconnecting;
        if (how === 'quit') void client.quit().catch(() => undefined);
        else client.disconnect();
        await until(() => wakeups.isClosed, 1_000, 'the wake-ups to close');
        await until(listening('wake:own-conn', 0), 3_000, 'the subscriber to close');
      } finally {
        wakeups.close();
        client.disconnect();
      }
    },
  );
});
