// Soak run: mixed lock and rate-limit traffic on private Redis deployments (one node, five Redlock masters, a 3-master
// Cluster, a 3-master Cluster with a replica per master, and @hasp/express over HTTP) while nodes are paused, killed
// and restarted, a busy Cluster slot moves, and replicas take over from killed masters.
// Prints operation, fault and violation counts; exits 1 on any violation, 2 when the run itself could not proceed.
// Usage: pnpm soak [--seconds N]   (or SOAK_SECONDS=N; default 120). Needs `pnpm build` for @hasp/express.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as delay } from 'node:timers/promises';
import { parseArgs } from 'node:util';
import express from 'express5';
import type { Cluster, Redis } from 'ioredis';
import { rateLimit, withLock } from '@hasp/express';
import {
  RedisLock,
  Redlock,
  TokenBucket,
  type HaspErrorCode,
  type Lease,
  type Locker,
} from '../../packages/core/src/index.js';
import { lockNames } from '../../packages/core/src/lock/redis-store.js';
import {
  startCluster,
  startRedis,
  startRedisNodes,
  stopAll,
  type RedisCluster,
  type RedisNode,
} from '../harness/redis.js';
import {
  clusterState,
  cutReplicaLink,
  keysPerMaster,
  masters,
  onNode,
  slotOf,
  startMigration,
  tookOver,
} from '../cluster/support.js';
import { BucketChecker, LockChecker, OpTracker, countUnhandled } from './checks.js';

// ---------------------------------------------------------------------------------------------------------------------
// Parameters.

const { values: argv } = parseArgs({ options: { seconds: { type: 'string' } }, allowPositionals: false });
const SECONDS = Number(argv.seconds ?? process.env.SOAK_SECONDS ?? 120);
if (!Number.isFinite(SECONDS) || SECONDS < 15) {
  console.error(`soak: --seconds (or SOAK_SECONDS) must be a number >= 15, got ${argv.seconds ?? process.env.SOAK_SECONDS}`);
  process.exit(2);
}

/** hasp's default per-call `timeout` (RedisLock, Redlock, TokenBucket). */
const TIMEOUT = 2_000;
const TTL = 1_200;
const WAIT = 1_000;
/** Killed nodes stay down longer than any lease's ttl: Redlock's delayed-restart assumption, applied to all. */
const DOWN_MS = TTL + 400;
/** Paused nodes stay frozen past the per-call timeout, so calls time out rather than just slow down. */
const PAUSE_MS = TIMEOUT + 300;
/** How long a failing-over master keeps answering after its replica's link was cut: those writes are lost. */
const LINK_DOWN_MS = 100;
const CAPACITY = 10;
/** The per-client key of the stacked route's first limit, shared by its loops. */
const STACKED_CLIENT = 'stacked-client';
const RATE = 50;
/** A lock operation may spend `wait`, then a last attempt and a release of `timeout` each; plus slack for load. */
const LOCK_BOUND = WAIT + 2 * TIMEOUT + 3_000;
const BUCKET_BOUND = TIMEOUT + 3_000;
const HTTP_BOUND = LOCK_BOUND + 1_000;
const WARMUP_MS = 2_000;
/** Fault-free time at the end, in which every kind of traffic must succeed again. */
const CALM_MS = 4_000;
const GAP_MS = 1_000;

const LOCK_ERRORS: HaspErrorCode[] = ['LOCK_BUSY', 'LOCK_UNAVAILABLE'];
const BUCKET_ERRORS: HaspErrorCode[] = ['RATE_LIMIT_UNAVAILABLE'];
/** What the middleware may answer: admitted, limited, busy, store unavailable. */
const HTTP_STATUSES = new Set([200, 423, 429, 503]);

// ---------------------------------------------------------------------------------------------------------------------
// Shared state.

const t0 = Date.now();
const ops = new OpTracker();
const locks = new LockChecker();
const buckets = new BucketChecker(CAPACITY, RATE);
const unhandled = countUnhandled();
const uncaught: unknown[] = [];
// Whoever reads our output is gone (the test's worker was killed): every write fails with EPIPE, and reporting that
// failure fails again. Stop instead; the harness's exit hook ends the servers.
for (const stream of [process.stdout, process.stderr]) stream.on('error', () => process.exit(2));
process.on('uncaughtException', (error) => {
  uncaught.push(error);
  console.error('soak: uncaught exception', error);
});
const faults = new Map<string, number>();
const httpStatuses = new Map<number, number>();
const backgroundErrors = new Map<string, number>();
/** Last successful operation per traffic kind, for the liveness check. */
const lastSuccess = new Map<string, number>();
let running = true;

const elapsed = (): string => `${((Date.now() - t0) / 1_000).toFixed(1).padStart(6)} s`;
const log = (text: string): void => console.log(`[${elapsed()}] ${text}`);
const bump = <K>(map: Map<K, number>, key: K, by = 1): void => {
  map.set(key, (map.get(key) ?? 0) + by);
};
const succeeded = (kind: string): void => {
  lastSuccess.set(kind, Date.now());
};
const onLockError = (backend: string) => (event: { operation: string; error: { code: string } }) =>
  bump(backgroundErrors, `${backend} ${event.operation} ${event.error.code}`);

// ---------------------------------------------------------------------------------------------------------------------
// Traffic.

/** One locker's loop on `key`: mostly `using` with wait, some tryAcquire + release, some holds long enough to extend. */
async function lockLoop(backend: string, locker: Locker, key: string): Promise<void> {
  const lock = `${backend}:${key}`;
  const section = async (lease: Lease, holdMs: number): Promise<void> => {
    locks.enter(lock, lease);
    await delay(holdMs);
    locks.exit(lock, lease);
  };
  for (let i = 0; running && i < 1_000_000; i++) {
    let ok: unknown;
    if (i % 5 === 4) {
      ok = await ops.run(`${backend} tryAcquire`, LOCK_BOUND, LOCK_ERRORS, async () => {
        const lease = await locker.tryAcquire(key, { ttl: TTL });
        if (!lease) return 'busy';
        try {
          await section(lease, 2);
        } finally {
          await lease.release();
        }
        return 'held';
      });
    } else {
      // Every 13th section outlives half the ttl, so auto-extension runs (and meets the faults).
      const holdMs = i % 13 === 12 ? Math.round(TTL * 0.7) : 2;
      ok = await ops.run(`${backend} using`, LOCK_BOUND, LOCK_ERRORS, () =>
        locker.using(key, (lease) => section(lease, holdMs).then(() => true), { wait: WAIT, ttl: TTL }),
      );
    }
    if (ok !== undefined) succeeded(`${backend} lock`);
    else await delay(20); // a failing store answers fast: do not spin
  }
}

async function bucketLoop(store: string, bucket: TokenBucket, key: string): Promise<void> {
  for (let i = 0; running && i < 1_000_000; i++) {
    const start = Date.now();
    const d = await ops.run(`${store} take`, BUCKET_BOUND, BUCKET_ERRORS, () => bucket.take(key));
    if (d) {
      buckets.record(store, key, start, Date.now(), d.allowed);
      succeeded(`${store} bucket`);
    }
    await delay(5 + Math.random() * 10);
  }
}

async function httpLoop(base: string, path: 'limited' | 'locked' | 'stacked', key: string): Promise<void> {
  for (let i = 0; running && i < 1_000_000; i++) {
    const start = Date.now();
    const status = await ops.run(`http ${path}`, HTTP_BOUND, [], async () => {
      const res = await fetch(`${base}/${path}?k=${encodeURIComponent(key)}`, { signal: AbortSignal.timeout(HTTP_BOUND * 2) });
      const body = await res.text();
      if (!HTTP_STATUSES.has(res.status)) throw new Error(`GET /${path}: unexpected status ${res.status}: ${body.slice(0, 200)}`);
      return res.status;
    });
    if (status !== undefined) {
      bump(httpStatuses, status);
      if (path === 'limited' && (status === 200 || status === 429)) buckets.record('http', key, start, Date.now(), status === 200);
      // Checked on the per-client bucket, which takes for every request and gets back what the phone limit refuses.
      if (path === 'stacked' && (status === 200 || status === 429)) buckets.record('http', STACKED_CLIENT, start, Date.now(), status === 200);
      if (status === 200 || status === 429 || status === 423) succeeded(`http ${path}`);
    }
    await delay(status === 503 ? 20 : 5 + Math.random() * 10);
  }
}

/** An Express 5 app with both middlewares on `redis` (answers 4xx/5xx as JSON with the error's status). */
function startHttp(redis: Redis): Promise<http.Server> {
  const app = express();
  app.get(
    '/limited',
    rateLimit({ capacity: CAPACITY, rate: RATE, redis, key: (req) => String(req.query.k), onStoreError: 'closed', policy: 'soak' }),
    (_req, res) => {
      res.json({ ok: true });
    },
  );
  // Two limits, as on an SMS route: one per client (the shared key every stacked loop uses, CAPACITY at RATE) and one per
  // phone number, which refuses most requests after the client's take; each refusal gives that take back.
  app.get(
    '/stacked',
    rateLimit({ capacity: CAPACITY, rate: RATE, redis, key: STACKED_CLIENT, onStoreError: 'closed', policy: 'soak-client' }),
    rateLimit({ capacity: 5, rate: 30, redis, key: (req) => String(req.query.k), onStoreError: 'closed', policy: 'soak-phone' }),
    (_req, res) => {
      res.json({ ok: true });
    },
  );
  app.get(
    '/locked',
    withLock((req) => `http:${String(req.query.k)}`, { redis, ttl: TTL, wait: WAIT }),
    async (req, res) => {
      const lease = (req as unknown as { lock: Lease }).lock;
      locks.enter(`http:${lease.key}`, lease);
      await delay(2);
      locks.exit(`http:${lease.key}`, lease);
      res.json({ fence: lease.fence });
    },
  );
  app.use((err: { status?: number; code?: string }, _req: express.Request, res: express.Response, _next: express.NextFunction) => {
    res.status(err.status ?? 500).json({ code: err.code });
  });
  const server = http.createServer(app);
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

// ---------------------------------------------------------------------------------------------------------------------
// Faults. Each scene restores everything before the next one starts, so Redlock never has more than two of five
// masters away and every killed node stays down for DOWN_MS (> ttl) before it comes back empty.

interface Scene {
  name: string;
  /** Rough duration, to fit scenes into the run. */
  estimate: number;
  run(): Promise<void>;
}

const pick = <T>(xs: readonly T[], n: number): T[] => [...xs].sort(() => Math.random() - 0.5).slice(0, n);

/** Kills `nodes`, keeps them down for DOWN_MS, restarts them empty; `lost` learns the data-loss window. */
async function killAndRestart(nodes: readonly RedisNode[], lost?: (deadAt: number, restartAt: number) => void): Promise<void> {
  await Promise.all(nodes.map((n) => n.kill()));
  const deadAt = Date.now();
  await delay(DOWN_MS);
  const restartAt = Date.now();
  lost?.(deadAt, restartAt);
  await Promise.all(nodes.map((n) => n.restart()));
}

async function pauseFor(nodes: readonly RedisNode[], ms: number): Promise<void> {
  for (const n of nodes) n.pause();
  try {
    await delay(ms);
  } finally {
    for (const n of nodes) n.resume();
  }
}

/**
 * Kills a master of `replicated` that has slots, LINK_DOWN_MS after cutting its replica's link, and waits for the
 * replica to take its slots over; records the bucket data loss (the takes it answered meanwhile are missing on the
 * replica). Then restarts the killed node empty, which rejoins as a replica of its successor, and waits until it is in
 * sync.
 */
async function failOver(replicated: RedisCluster): Promise<void> {
  const anyLive = replicated.nodes[0]!;
  const view = await onNode(anyLive.port, [], (node) => masters(node));
  const serving = view.filter((m) => m.ranges.length > 0);
  const victimInfo = pick(serving, 1)[0];
  if (victimInfo === undefined) throw new Error('no master with slots in the replicated Cluster');
  const slot = victimInfo.ranges[0]![0];
  const victim = replicated.nodes.find((n) => n.port === victimInfo.port)!;
  const observer = replicated.nodes.find((n) => n !== victim)!;
  // What the master answers from here on never reaches its replica (see cutReplicaLink).
  const cut = await cutReplicaLink(victim.port);
  await delay(LINK_DOWN_MS);
  await victim.kill();
  const killedAt = Date.now();
  const deadline = killedAt + 20_000;
  for (;;) {
    if (await tookOver(observer.port, slot, victim.port)) break;
    if (Date.now() > deadline) throw new Error(`no replica took over slot ${slot} within 20 s of killing :${victim.port}`);
    await delay(100);
  }
  const promotedAt = Date.now();
  // Locks stay exclusive only because a takeover outlasts every lease the dead master granted (see the core README).
  if (promotedAt - killedAt <= TTL) throw new Error(`the takeover took ${promotedAt - killedAt} ms, not more than the ttl`);
  buckets.dataLoss('replicated', killedAt, promotedAt);
  await cut.restore();
  await victim.restart();
  const synced = Date.now() + 20_000;
  for (;;) {
    const states = await Promise.all(replicated.nodes.map((n) => clusterState(n.port)));
    const link = await onNode(victim.port, '', async (node) => String(await node.info('replication')));
    if (states.every((st) => st === 'ok') && link.includes('role:slave') && link.includes('master_link_status:up')) break;
    if (Date.now() > synced) throw new Error(`:${victim.port} did not rejoin as a replica in sync within 20 s`);
    await delay(100);
  }
}

function scenes(
  single: RedisNode,
  redlockNodes: RedisNode[],
  cluster: RedisCluster,
  clusterAdmin: Cluster,
  busyName: string,
  replicated: RedisCluster,
): Scene[] {
  return [
    { name: 'pause the single node', estimate: PAUSE_MS, run: () => pauseFor([single], PAUSE_MS) },
    {
      name: 'kill a Cluster master, restart it empty',
      estimate: DOWN_MS + 6_000,
      run: async () => {
        await killAndRestart(pick(cluster.nodes, 1), (deadAt, restartAt) => buckets.dataLoss('cluster', deadAt, restartAt));
        const deadline = Date.now() + 20_000;
        while ((await Promise.all(cluster.nodes.map((n) => clusterState(n.port)))).some((s) => s !== 'ok')) {
          if (Date.now() > deadline) throw new Error('the cluster did not report ok within 20 s of the restart');
          await delay(100);
        }
      },
    },
    {
      name: 'kill 2 of 5 Redlock masters, restart them empty',
      estimate: DOWN_MS + 500,
      run: () => killAndRestart(pick(redlockNodes, 2)),
    },
    {
      name: 'move the busy Cluster slot to another master',
      estimate: 2_500,
      run: async () => {
        const view = await masters(clusterAdmin);
        const slot = await slotOf(clusterAdmin, busyName);
        const owner = view.find((m) => m.ranges.some(([a, b]) => slot >= a && slot <= b))!;
        const migration = await startMigration(view, slot, pick(view.filter((m) => m !== owner), 1)[0]!);
        await delay(1_500);
        await migration.finish();
      },
    },
    {
      name: 'kill the single node, restart it empty',
      estimate: DOWN_MS + 500,
      run: () =>
        killAndRestart([single], (deadAt, restartAt) => {
          buckets.dataLoss('single', deadAt, restartAt);
          buckets.dataLoss('http', deadAt, restartAt);
        }),
    },
    { name: 'pause 1 Redlock master', estimate: PAUSE_MS, run: () => pauseFor(pick(redlockNodes, 1), PAUSE_MS) },
    {
      name: 'kill 1 Redlock master and pause another',
      estimate: DOWN_MS + 500,
      run: async () => {
        const [killed, paused] = pick(redlockNodes, 2) as [RedisNode, RedisNode];
        await Promise.all([killAndRestart([killed]), pauseFor([paused], DOWN_MS)]);
      },
    },
    // Last: the suite's 30 s soak does not reach it (test/cluster/faults.test.ts covers a failover there).
    { name: 'fail a Cluster master over to its replica', estimate: 8_000, run: () => failOver(replicated) },
  ];
}

// ---------------------------------------------------------------------------------------------------------------------
// The run.

async function main(): Promise<number> {
  log(`soak: ${SECONDS} s; ttl ${TTL} ms, wait ${WAIT} ms, bucket ${CAPACITY} + ${RATE}/s; starting Redis...`);
  const [single, redlockNodes, cluster, replicated] = await Promise.all([
    startRedis(),
    startRedisNodes(5),
    startCluster(),
    startCluster({ masters: 3, replicas: 1 }),
  ]);
  log(
    `single node :${single.port}; Redlock :${redlockNodes.map((n) => n.port).join(' :')}; ` +
      `Cluster :${cluster.nodes.map((n) => n.port).join(' :')}; replicated Cluster :${replicated.nodes.map((n) => n.port).join(' :')}`,
  );
  const clusterAdmin = cluster.client();
  const replicatedAdmin = replicated.client();
  const quitters: (Redis | Cluster)[] = [];
  const own = <C extends Redis | Cluster>(c: C): C => {
    quitters.push(c);
    return c;
  };
  const closers: { close(): void }[] = [];
  const loops: Promise<void>[] = [];

  // RedisLock and TokenBucket on the single node and on the Cluster; Redlock over the five masters.
  const clusterKeys = [...(await keysPerMaster(clusterAdmin, 'lock', (k) => lockNames('soak:lock:', k).lock)).values()].flat();
  const busyName = lockNames('soak:lock:', clusterKeys[0]!).lock;
  const replicatedKeys = [...(await keysPerMaster(replicatedAdmin, 'lock', (k) => lockNames('soak:lock:', k).lock)).values()].flat();
  for (let i = 0; i < 3; i++) {
    const singleClient = own(single.client());
    const clusterClient = own(cluster.client());
    const replicatedClient = own(replicated.client());
    const redlockClients = redlockNodes.map((n) => own(n.client()));
    const lockers: [string, Locker & { close(): void }, string[]][] = [
      ['single', new RedisLock(singleClient, { prefix: 'soak:lock:', onError: onLockError('single') }), ['a', 'b', 'c']],
      ['cluster', new RedisLock(clusterClient, { prefix: 'soak:lock:', onError: onLockError('cluster') }), clusterKeys],
      ['redlock', new Redlock(redlockClients, { prefix: 'soak:lock:', onError: onLockError('redlock') }), ['a', 'b']],
      ['replicated', new RedisLock(replicatedClient, { prefix: 'soak:lock:', onError: onLockError('replicated') }), replicatedKeys],
    ];
    for (const [backend, locker, keys] of lockers) {
      closers.push(locker);
      // On a standalone connection, two loops per key and locker: their waiters get the lock from each other inside the
      // process, without waiting for Redis (see "Hand-offs within a process" in the core README), under every fault.
      const perKey = backend === 'single' || backend === 'replicated' ? 2 : 1;
      for (const key of keys) for (let j = 0; j < perKey; j++) loops.push(lockLoop(backend, locker, key));
    }
    const bucketOpts = { capacity: CAPACITY, rate: RATE, prefix: 'soak:tb:' };
    for (const [store, redis, keys] of [
      ['single', singleClient, ['x', 'y', 'z', 'w']],
      ['cluster', clusterClient, ['x', 'y', 'z', 'w']],
      ['replicated', replicatedClient, ['x', 'y']],
    ] as const) {
      const bucket = new TokenBucket({ ...bucketOpts, redis });
      for (const key of keys) loops.push(bucketLoop(store, bucket, key));
    }
  }
  const server = await startHttp(own(single.client()));
  const base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  for (let i = 0; i < 2; i++) {
    loops.push(httpLoop(base, 'limited', `h${i}`), httpLoop(base, 'locked', `l${i % 2}`), httpLoop(base, 'locked', 'l0'));
  }
  for (let i = 0; i < 3; i++) loops.push(httpLoop(base, 'stacked', `p${i}`));
  log(`traffic: ${loops.length} loops (locks, buckets, HTTP)`);

  const progress = setInterval(() => {
    const total = [...ops.counts.values()].reduce((a, b) => a + b, 0);
    const v = locks.violations + ops.hangs + ops.untypedCount + unhandled.reasons.length + uncaught.length;
    log(`progress: ${total} operations, ${[...faults.values()].reduce((a, b) => a + b, 0)} faults, ${v} violations so far`);
  }, 10_000);
  progress.unref();

  // Faults, in rotation, while they fit before the calm period.
  const end = t0 + SECONDS * 1_000;
  let infraError: unknown;
  let calmFrom = Date.now();
  await delay(WARMUP_MS);
  const all = scenes(single, redlockNodes, cluster, clusterAdmin, busyName, replicated);
  for (let s = 0; ; s++) {
    const fitting = all.filter((sc) => Date.now() + sc.estimate + GAP_MS < end - CALM_MS);
    if (fitting.length === 0) break;
    // Rotate through all scenes; near the end, take the next one that still fits.
    const scene = [...all.slice(s % all.length), ...all.slice(0, s % all.length)].find((sc) => fitting.includes(sc))!;
    log(`fault: ${scene.name}`);
    try {
      await scene.run();
    } catch (error) {
      infraError = error;
      log(`fault "${scene.name}" could not be carried out: ${(error as Error).message}`);
      break;
    }
    bump(faults, scene.name);
    calmFrom = Date.now();
    await delay(GAP_MS);
  }
  const remaining = end - Date.now();
  if (remaining > 0) await delay(remaining);

  // Stop: every loop ends after its current (bounded) operation.
  running = false;
  log('stopping traffic...');
  const stopped = await Promise.race([Promise.all(loops).then(() => true), delay(LOCK_BOUND * 2, undefined, { ref: false }).then(() => false)]);
  clearInterval(progress);
  const kinds = [
    'single lock',
    'cluster lock',
    'redlock lock',
    'replicated lock',
    'single bucket',
    'cluster bucket',
    'replicated bucket',
    'http limited',
    'http locked',
    'http stacked',
  ];
  const stale = kinds.filter((k) => (lastSuccess.get(k) ?? 0) < calmFrom);

  // Shut down: close lockers, quit every client, stop the servers.
  for (const c of closers) c.close();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  server.closeAllConnections();
  await Promise.all(quitters.map((c) => Promise.race([c.quit().catch(() => undefined), delay(2_000, undefined, { ref: false }).then(() => c.disconnect())])));
  clusterAdmin.disconnect();
  replicatedAdmin.disconnect();
  await stopAll();

  // Report.
  const overAdmissions = buckets.check();
  const rows: [string, number | string][] = [];
  console.log('\n==== soak report ====');
  console.log(`duration: ${((Date.now() - t0) / 1_000).toFixed(1)} s (asked ${SECONDS} s)`);
  console.log('\noperations:');
  for (const [name, n] of [...ops.counts].sort()) console.log(`  ${name.padEnd(36)} ${n}`);
  console.log(`  ${'HTTP statuses'.padEnd(36)} ${[...httpStatuses].sort().map(([s, n]) => `${s}: ${n}`).join(', ')}`);
  console.log(`  ${'critical sections'.padEnd(36)} ${locks.sections} (overran their lease: ${locks.overruns})`);
  console.log(`  ${'bucket decisions'.padEnd(36)} ${buckets.admitted} admitted, ${buckets.denied} denied`);
  const slowest = [...ops.slowestByKind].sort().map(([k, ms]) => `${k} ${Math.round(ms)}`).join(', ');
  console.log(`  ${'slowest, ms'.padEnd(36)} ${slowest}`);
  console.log(`  ${'bounds, ms'.padEnd(36)} locks ${LOCK_BOUND}, buckets ${BUCKET_BOUND}, HTTP ${HTTP_BOUND}`);
  console.log(`  ${'background (onError) events'.padEnd(36)} ${[...backgroundErrors].map(([k, n]) => `${k}: ${n}`).join(', ') || 'none'}`);
  console.log('\nfaults:');
  for (const [name, n] of faults) console.log(`  ${name.padEnd(52)} ${n}`);
  rows.push(
    ['mutual-exclusion violations', locks.exclusionViolations],
    ['fence regressions', locks.fenceRegressions],
    ['bucket over-admissions', overAdmissions],
    ['unhandled rejections', unhandled.reasons.length],
    ['uncaught exceptions', uncaught.length],
    [`hangs (unsettled past the bound)`, ops.hangs + (stopped ? 0 : ops.inFlight)],
    ['errors other than the typed ones', ops.untypedCount],
    ['traffic not recovered after the last fault', stale.length],
  );
  console.log('\nviolations:');
  for (const [name, n] of rows) console.log(`  ${name.padEnd(52)} ${n}`);
  const examples = [
    ...locks.examples,
    ...buckets.examples,
    ...ops.hangExamples,
    ...ops.untyped.map((e) => String((e as Error)?.stack ?? e)),
    ...unhandled.reasons.slice(0, 5).map((e) => `unhandled: ${String((e as Error)?.stack ?? e)}`),
    ...uncaught.slice(0, 5).map((e) => `uncaught: ${String((e as Error)?.stack ?? e)}`),
    ...stale.map((k) => `${k}: no success after the last fault`),
  ];
  if (examples.length > 0) console.log(`\nexamples:\n  ${examples.join('\n  ')}`);
  const violations = rows.reduce((a, [, n]) => a + Number(n), 0);
  if (infraError !== undefined) {
    console.log(`\nthe run could not carry out its faults: ${(infraError as Error).message}`);
    return violations > 0 ? 1 : 2;
  }
  console.log(`\n${violations === 0 ? 'OK: no violations' : `FAILED: ${violations} violations`}`);
  return violations > 0 ? 1 : 0;
}

main().then(
  (code) => {
    process.exitCode = code;
    unhandled.stop();
    // Everything is closed: the process must now end by itself. If something still holds it open, say so and fail.
    setTimeout(() => {
      console.error(
        `soak: the process is still alive 10 s after shutdown; open: ${process.getActiveResourcesInfo().join(', ')}`,
      );
      process.exit(1);
    }, 10_000).unref();
  },
  async (error: unknown) => {
    console.error('soak: failed to run', error);
    await stopAll().catch(() => undefined);
    process.exit(2);
  },
);
