// Cluster faults under traffic: moving a busy key's slot to another master, and a master dying and coming back. Both
// must surface only as the contract's typed errors, within bounded time, with no unhandled rejection, no second holder,
// no falling fence and no bucket over-admission.
import { Redis, type Cluster } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RedisLock, TokenBucket, type HaspErrorCode } from '../../packages/core/src/index.js';
import { RateLimiter, type StoreStateEvent } from '../../packages/core/src/http/index.js';
import { lockNames } from '../../packages/core/src/lock/redis-store.js';
import { keyStem } from '../../packages/core/src/redis/keys.js';
import { startCluster, stopAll, type RedisCluster } from '../harness/redis.js';
import { uniquePrefix, until, within } from '../core/helpers.js';
import { trackUnhandled } from '../redlock/support.js';
import { BucketChecker, LockChecker, OpTracker } from '../soak/checks.js';
import {
  clusterState,
  cutReplicaLink,
  flaggedFailed,
  keysPerMaster,
  masters,
  ownerOf,
  slotOf,
  startMigration,
  subscriberPorts,
  tookOver,
} from './support.js';

let cluster: RedisCluster;
let replicated: RedisCluster;

beforeAll(async () => {
  [cluster, replicated] = await Promise.all([
    // Without full coverage the masters that are left keep serving their own slots while one is down (the soak run
    // covers the default, where the whole cluster stops).
    startCluster({ args: ['--cluster-require-full-coverage', 'no'] }),
    startCluster({ masters: 3, replicas: 1 }),
  ]);
});

afterAll(async () => {
  await stopAll();
});

/** hasp's default per-call bound (RedisLock and TokenBucket `timeout`). */
const TIMEOUT = 2_000;
const WAIT = 1_000;
const TTL = 1_000;
const CAPACITY = 5;
const RATE = 20;
/** A `using` may spend `wait`, then its last attempt and its release may each take `timeout`. */
const LOCK_BOUND = WAIT + 2 * TIMEOUT + 2_000;
const BUCKET_BOUND = TIMEOUT + 2_000;
const LOCK_ERRORS: HaspErrorCode[] = ['LOCK_BUSY', 'LOCK_UNAVAILABLE'];
const BUCKET_ERRORS: HaspErrorCode[] = ['RATE_LIMIT_UNAVAILABLE'];

/** Lockers and bucket takers looping on `keys` (each its own Cluster client) until stopped. */
class Traffic {
  readonly ops = new OpTracker();
  readonly locks = new LockChecker();
  readonly buckets = new BucketChecker(CAPACITY, RATE);
  /** Successful operations per key, with their start time. */
  readonly successes: { kind: 'lock' | 'bucket'; key: string; start: number }[] = [];
  private running = true;
  private readonly clients: Cluster[] = [];
  private readonly lockers: RedisLock[] = [];
  private readonly loops: Promise<void>[] = [];

  constructor(on: RedisCluster, keys: readonly string[], lockPrefix: string, bucketPrefix: string) {
    for (let i = 0; i < 3; i++) {
      const client = on.client();
      this.clients.push(client);
      const locker = new RedisLock(client, { prefix: lockPrefix, onError: () => undefined });
      this.lockers.push(locker);
      const bucket = new TokenBucket({ capacity: CAPACITY, rate: RATE, redis: client, prefix: bucketPrefix });
      for (const key of keys) {
        this.loops.push(this.lockLoop(locker, key), this.bucketLoop(bucket, key));
      }
    }
  }

  private async lockLoop(locker: RedisLock, key: string): Promise<void> {
    for (let i = 0; i < 5_000 && this.running; i++) {
      const start = Date.now();
      const ok = await this.ops.run('lock', LOCK_BOUND, LOCK_ERRORS, () =>
        locker.using(
          key,
          async (lease) => {
            this.locks.enter(key, lease);
            await new Promise((resolve) => setTimeout(resolve, 2));
            this.locks.exit(key, lease);
            return true;
          },
          { wait: WAIT, ttl: TTL },
        ),
      );
      if (ok) this.successes.push({ kind: 'lock', key, start });
      else await pause(20); // a failing store answers fast: do not spin
    }
  }

  private async bucketLoop(bucket: TokenBucket, key: string): Promise<void> {
    for (let i = 0; i < 5_000 && this.running; i++) {
      const start = Date.now();
      const d = await this.ops.run('bucket', BUCKET_BOUND, BUCKET_ERRORS, () => bucket.take(key));
      if (d) {
        this.buckets.record('cluster', key, start, Date.now(), d.allowed);
        this.successes.push({ kind: 'bucket', key, start });
      }
      await pause(10);
    }
  }

  /** Resolves once both kinds of operation succeeded on `key` after `since`. */
  recovered(key: string, since: number): boolean {
    const after = this.successes.filter((s) => s.key === key && s.start >= since);
    return after.some((s) => s.kind === 'lock') && after.some((s) => s.kind === 'bucket');
  }

  async stop(): Promise<void> {
    this.running = false;
    await Promise.all(this.loops);
    for (const l of this.lockers) l.close();
    for (const c of this.clients) c.disconnect();
  }

  /** Asserts every invariant the traffic watched. */
  expectClean(): void {
    expect(this.ops.untyped, 'errors other than the typed ones').toEqual([]);
    expect(this.ops.hangExamples).toEqual([]);
    expect(this.ops.hangs).toBe(0);
    expect(this.locks.examples, 'lock violations').toEqual([]);
    expect(this.locks.violations).toBe(0);
    expect(this.buckets.check(), this.buckets.examples.join('\n')).toBe(0);
    expect(this.locks.sections).toBeGreaterThan(0);
    expect(this.buckets.admitted).toBeGreaterThan(0);
  }
}

const pause = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

describe('Cluster faults under traffic', () => {
  it('moves a busy key’s slot to another master mid-run: typed errors at worst, then served by the new owner', async () => {
    const lockPrefix = uniquePrefix('move-lock');
    const bucketPrefix = uniquePrefix('move-tb');
    const admin = cluster.client();
    const unhandled = trackUnhandled();
    // The same key string under both prefixes: one hash tag, so the lock's and the bucket's names share the slot.
    const key = 'busy';
    const slot = await slotOf(admin, lockNames(lockPrefix, key).lock);
    expect(await slotOf(admin, keyStem(bucketPrefix, key))).toBe(slot);
    const view = await masters(admin);
    const from = ownerOf(view, slot);
    const to = view.find((m) => m.port !== from)!;
    const traffic = new Traffic(cluster, [key], lockPrefix, bucketPrefix);
    try {
      await until(() => traffic.recovered(key, 0), 5_000, 'traffic on the busy key');
      await pause(500);
      const migration = await startMigration(view, slot, to);
      // While the slot is half-moved, multi-key scripts meet ASK/TRYAGAIN; hold that state long enough to outlast
      // ioredis's redirection budget, so some operations must give up with a typed error, not hang.
      await pause(2_500);
      await migration.finish();
      const movedAt = Date.now();
      await until(() => traffic.recovered(key, movedAt), 10_000, 'traffic to succeed on the new owner');
      await pause(500);
    } finally {
      await traffic.stop();
      unhandled.stop();
    }
    traffic.expectClean();
    expect(unhandled.reasons).toEqual([]);
    expect(ownerOf(await masters(admin), slot)).toBe(to.port);
    // The lock's fence key travelled with the slot.
    const direct = new Redis({ host: '127.0.0.1', port: to.port });
    try {
      expect(await direct.exists(lockNames(lockPrefix, key).fence)).toBe(1);
    } finally {
      direct.disconnect();
    }
    admin.disconnect();
  });

  it('a master dies and comes back: its keys fail typed and bounded, the others keep working, a waiter whose subscriber was on it is still woken', async () => {
    const lockPrefix = uniquePrefix('kill-lock');
    const bucketPrefix = uniquePrefix('kill-tb');
    const wakePrefix = uniquePrefix('kill-wake');
    const admin = cluster.client();
    const wakeClients = [cluster.client(), cluster.client()];
    const [holders, waiters] = wakeClients.map((c) => new RedisLock(c, { prefix: wakePrefix })) as [RedisLock, RedisLock];
    const unhandled = trackUnhandled();
    const ports = cluster.nodes.map((n) => n.port);
    const byMaster = await keysPerMaster(admin, 'kill', (k) => lockNames(lockPrefix, k).lock);
    const wakeKeys = await keysPerMaster(admin, 'wake', (k) => lockNames(wakePrefix, k).lock);
    const keys = [...byMaster.values()].flat();
    const traffic = new Traffic(cluster, keys, lockPrefix, bucketPrefix);
    let restartAt = 0;
    let victimPort = 0;
    try {
      await until(() => keys.every((k) => traffic.recovered(k, 0)), 5_000, 'traffic on every master');
      await pause(300);

      // A waiter, armed on a key of one master, whose wake-up subscription lives on another: that one dies.
      const first = [...wakeKeys.values()][0]![0]!;
      const warm = await holders.acquire(first, { ttl: 30_000 });
      const warmWaiter = waiters.acquire(first, { wait: 10_000 });
      warmWaiter.catch(() => undefined); // awaited below
      const firstChannel = lockNames(wakePrefix, first).channel;
      let subPorts: number[] = [];
      await until(async () => (subPorts = await subscriberPorts(ports, firstChannel)).length > 0, 5_000, 'the subscriber');
      victimPort = subPorts[0]!;
      await warm.release();
      await (await within(warmWaiter, 10_000, 'the first hand-off')).release();
      const [wakeKey] = [...wakeKeys.entries()].find(([port]) => port !== victimPort)![1];
      const channel = lockNames(wakePrefix, wakeKey!).channel;
      const holder = await holders.acquire(wakeKey!, { ttl: 60_000 });
      const waiting = waiters.acquire(wakeKey!, { wait: 60_000 });
      waiting.catch(() => undefined); // awaited below
      await until(async () => (await subscriberPorts(ports, channel)).includes(victimPort), 5_000, 'the waiter to subscribe');

      const victim = cluster.nodes.find((n) => n.port === victimPort)!;
      const survivors = cluster.nodes.filter((n) => n !== victim);
      await victim.kill();
      const deadAt = Date.now();
      await until(
        async () => (await Promise.all(survivors.map((n) => flaggedFailed(n.port, victimPort)))).every(Boolean),
        15_000,
        'the survivors to flag the dead master',
        100,
      );
      const flaggedAt = Date.now();
      // ioredis moved the subscription to a live node; a release now must reach the waiter without the 1 s poll.
      await until(
        async () => (await subscriberPorts(survivors.map((n) => n.port), channel)).length > 0,
        10_000,
        'the subscription to move to a live node',
        50,
      );
      const releasedAt = performance.now();
      expect(await holder.release()).toBe(true);
      const woken = await within(waiting, 10_000, 'the waiter across the subscriber node’s death');
      // Woken by the release, not by the 1 s poll (with slack for a loaded machine running other suites alongside).
      expect(performance.now() - releasedAt).toBeLessThan(600);
      expect(woken.fence).toBeGreaterThan(holder.fence);
      await woken.release();

      // The survivors' keys keep working while the victim is down.
      const survivorKeys = keys.filter((k) => k !== byMaster.get(victimPort)![0]);
      await until(() => survivorKeys.every((k) => traffic.recovered(k, flaggedAt)), 10_000, 'the survivors to serve');
      await pause(500);
      // Down for longer than any lease's ttl, so nobody's lease outlives the data the restart throws away.
      expect(Date.now() - deadAt).toBeGreaterThan(TTL);
      restartAt = Date.now();
      traffic.buckets.dataLoss('cluster', deadAt, restartAt);
      await victim.restart();
      await until(
        async () => (await Promise.all(ports.map(clusterState))).every((s) => s === 'ok') &&
          !(await Promise.all(survivors.map((n) => flaggedFailed(n.port, victimPort)))).some(Boolean),
        15_000,
        'the cluster to take the master back',
        100,
      );
      const okAt = Date.now();
      await until(() => keys.every((k) => traffic.recovered(k, okAt)), 15_000, 'traffic to succeed on every master');
    } finally {
      await traffic.stop();
      unhandled.stop();
      holders.close();
      waiters.close();
      for (const c of [admin, ...wakeClients]) c.disconnect();
    }
    traffic.expectClean();
    expect(unhandled.reasons).toEqual([]);
    // The victim's keys could not be served while it was down: the failures were typed, and there were some.
    expect(traffic.ops.total(/^lock LOCK_UNAVAILABLE$/)).toBeGreaterThan(0);
    expect(traffic.ops.total(/^bucket RATE_LIMIT_UNAVAILABLE$/)).toBeGreaterThan(0);
    expect(traffic.recovered(byMaster.get(victimPort)![0]!, restartAt)).toBe(true);
  });
});

describe('Cluster failover under traffic', () => {
  it('a master dies and its replica takes over: typed errors while it happens, then service with nothing restarted', async () => {
    const lockPrefix = uniquePrefix('failover-lock');
    const bucketPrefix = uniquePrefix('failover-tb');
    const admin = replicated.client();
    const unhandled = trackUnhandled();
    const byMaster = await keysPerMaster(admin, 'failover', (k) => lockNames(lockPrefix, k).lock);
    const keys = [...byMaster.values()].flat();
    const [victimPort, [victimKey]] = [...byMaster.entries()][0]! as [number, string[]];
    const slot = await slotOf(admin, lockNames(lockPrefix, victimKey!).lock);
    const victim = replicated.nodes.find((n) => n.port === victimPort)!;
    const survivor = replicated.nodes.find((n) => n !== victim)!;
    const traffic = new Traffic(replicated, keys, lockPrefix, bucketPrefix);
    let promotedAt = 0;
    try {
      await until(() => keys.every((k) => traffic.recovered(k, 0)), 5_000, 'traffic on every master');
      await pause(300);
      // Replication is asynchronous: the writes a master answered last may never reach its replica. Cutting the link
      // 100 ms before the kill makes sure some are lost. A bucket may therefore forget the takes just before the kill
      // (admissions from there on are checked as a fresh bucket's). A lock stays safe: the replica is promoted only
      // after cluster-node-timeout (2 s), longer than any lease of the dead master lasts (TTL, and nothing can extend
      // one there), and its fences come from the clock, which has moved past every fence the victim handed out.
      const cut = await cutReplicaLink(victimPort);
      await pause(100);
      await victim.kill();
      const killedAt = Date.now();
      // After cluster-node-timeout (2 s) the victim's replica is elected and takes its slots over.
      await until(
        () => tookOver(survivor.port, slot, victimPort),
        20_000,
        'a replica to take over the dead master’s slots',
        100,
      );
      promotedAt = Date.now();
      expect(promotedAt - killedAt).toBeGreaterThan(TTL);
      traffic.buckets.dataLoss('cluster', killedAt, promotedAt);
      await cut.restore();
      await until(() => keys.every((k) => traffic.recovered(k, promotedAt)), 15_000, 'traffic to succeed on every master');
      await pause(500);
    } finally {
      await traffic.stop();
      unhandled.stop();
      admin.disconnect();
    }
    traffic.expectClean();
    expect(unhandled.reasons).toEqual([]);
    expect(traffic.ops.total(/ (LOCK_UNAVAILABLE|RATE_LIMIT_UNAVAILABLE)$/)).toBeGreaterThan(0);
    expect(traffic.recovered(victimKey!, promotedAt)).toBe(true);
  });

  it("closes a failed master's rate-limit circuit once its replica has taken over: the limiter hears Redis back", async () => {
    const admin = replicated.client();
    const client = replicated.client();
    try {
      const view = await masters(admin);
      const nodesView = ((await admin.cluster('NODES')) as string).trim().split('\n').map((line) => line.split(' '));
      // A master whose replica is up (the test before left one master without).
      const victimInfo = view.find(
        (m) => m.ranges.length > 0 && nodesView.some((f) => f[2]!.includes('slave') && !f[2]!.includes('fail') && f[3] === m.id),
      )!;
      let key = '';
      for (let i = 0; key === ''; i++) {
        if (ownerOf(view, await slotOf(admin, keyStem('p', `circuit-failover:${i}`))) === victimInfo.port) key = `circuit-failover:${i}`;
      }
      const heard: StoreStateEvent[] = [];
      const limiter = new RateLimiter(
        {
          // Probes that fail fast while the master is dead: when the replica takes over, none is on its way to succeed there.
          bucket: new TokenBucket({ capacity: 100, rate: '100/min', redis: client, prefix: uniquePrefix('cfo'), timeout: 200 }),
          key: (a: { key: string }) => a.key,
          onStoreState: (e) => void heard.push(e),
        },
        () => undefined,
      );
      expect((await limiter.check({ key }))?.allowed).toBe(true);
      await replicated.nodes.find((n) => n.port === victimInfo.port)!.kill();
      // Its circuit opens; once the replica serves the slots, the key maps to the new master, whose circuit is closed,
      // and only a probe of the old one can tell that Redis answers again.
      await until(
        async () => {
          await limiter.check({ key });
          return heard.length === 2;
        },
        25_000,
        'the limiter to hear Redis back after the failover',
        100,
      );
      expect(heard.map((e) => e.state)).toEqual(['down', 'up']);
    } finally {
      admin.disconnect();
      client.disconnect();
    }
  });
});

describe('the rate limiter on a Cluster with one master frozen', () => {
  it("sends only that master's keys to its policy: the other masters keep answering theirs, and the outage is heard once", async () => {
    const client = cluster.client();
    const heard: StoreStateEvent[] = [];
    const limiter = new RateLimiter(
      {
        capacity: 100,
        rate: '100/min',
        redis: client,
        policy: uniquePrefix('circuits'),
        key: (a: { key: string }) => a.key,
        onStoreError: 'closed',
        onStoreState: (e) => void heard.push(e),
      },
      () => undefined,
    );
    const status = (key: string): Promise<number | undefined> =>
      limiter.check({ key }).then(
        (d) => (d?.allowed ? 200 : 429),
        (e: { status?: number }) => e.status,
      );
    // A bucket's slot is its key's (the hash tag); one key per master.
    const placed = [...(await keysPerMaster(client, 'rl', (k) => keyStem('p', k))).entries()];
    const [frozenPort, [frozenKey]] = placed[0]!;
    const others = placed.slice(1).map(([, [key]]) => key!);
    for (const key of [frozenKey!, ...others]) expect(await status(key)).toBe(200);
    const node = cluster.nodes.find((n) => n.port === frozenPort)!;
    node.pause();
    try {
      // Unanswered within the bucket's 2 s timeout: 503, and down.
      expect(await status(frozenKey!)).toBe(503);
      expect(heard.map((e) => e.state)).toEqual(['down']);
      // The other masters' keys still go to Redis (they used to follow the policy too: 503 under 'closed').
      for (const key of others) expect(await status(key)).toBe(200);
      // The frozen master's keys are refused by their circuit at once, not after another timeout.
      const refused = performance.now();
      expect(await status(frozenKey!)).toBe(503);
      expect(performance.now() - refused).toBeLessThan(500);
    } finally {
      node.resume();
    }
    await until(
      async () => {
        await status(frozenKey!);
        return heard.length === 2;
      },
      10_000,
      "the frozen master's circuit to close",
      50,
    );
    expect(heard.map((e) => e.state)).toEqual(['down', 'up']);
    expect(await status(frozenKey!)).toBe(200);
    client.disconnect();
  });
});
