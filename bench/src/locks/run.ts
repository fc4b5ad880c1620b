// The two lock workloads, run inside a forked child: uncontended (each worker on its own key, acquire + release in a
// loop) and contended (all workers on one key, each holding it ~1 ms), with a warm-up whose numbers are discarded.
import { performance } from 'node:perf_hooks';
import { Redis } from 'ioredis';
import { setTimeout as sleep } from 'node:timers/promises';
import { Samples } from '../stats.js';
import { type LockSpec, makeLockLib } from './libs.js';

export interface LockJob {
  spec: LockSpec;
  ports: number[];
  workers: number;
  warmupMs: number;
  measureMs: number;
  /** Distinguishes the keys of each run, so no run meets another's leftovers. */
  runId: string;
  /** Contended only: how long each holder keeps the lock. */
  holdMs?: number;
}

export interface UncontendedResult {
  cyclesPerSec: number;
  acquireP50: number;
  acquireP99: number;
  failures: number;
  /** CPU time per cycle in the measured window: this (client) process, and all Redis nodes used, summed. */
  clientCpuUs: number;
  redisCpuUs: number;
}

/** Seconds of CPU the Redis servers on `ports` have used (INFO cpu), summed, read over its own connections. */
async function redisCpu(clients: Redis[]): Promise<number> {
  let total = 0;
  for (const c of clients) {
    const info = await c.info('cpu');
    total += Number(/used_cpu_user:([\d.]+)/.exec(info)?.[1]) + Number(/used_cpu_sys:([\d.]+)/.exec(info)?.[1]);
  }
  return total;
}

export interface ContendedResult {
  sectionsPerSec: number;
  waitP50: number;
  waitP99: number;
  waitMax: number;
  failures: number;
  violations: number;
  perWorkerMin: number;
  perWorkerMax: number;
  /** perWorkerMin / perWorkerMax of this run: the target is judged on the least fair run, not on medians of min and max. */
  fairness?: number;
  handoffP50: number;
  handoffP99: number;
  /** Mean hold actually observed (setTimeout granularity), ms. */
  holdMean: number;
}

/** Runs `body` on every worker until the window closes; `measuring()` tells whether numbers count yet. */
async function measureWindow(
  job: LockJob,
  onMeasureStart: () => void,
  onMeasureEnd: () => void = () => undefined,
): Promise<{ measuring: () => boolean; stopped: () => boolean; elapsed: () => number; done: Promise<void> }> {
  let measuring = false;
  let stopped = false;
  let started = 0;
  let ended = 0;
  const done = (async () => {
    await sleep(job.warmupMs);
    onMeasureStart();
    measuring = true;
    started = performance.now();
    await sleep(job.measureMs);
    ended = performance.now();
    onMeasureEnd();
    measuring = false;
    stopped = true;
  })();
  return { measuring: () => measuring, stopped: () => stopped, elapsed: () => (ended || performance.now()) - started, done };
}

export async function runUncontended(job: LockJob): Promise<UncontendedResult> {
  const lib = await makeLockLib(job.spec, job.ports);
  const probes = job.ports.slice(0, job.spec.nodes).map((port) => new Redis({ port, host: '127.0.0.1' }));
  const acquire = new Samples();
  let cycles = 0;
  let failures = 0;
  let cpu0 = process.cpuUsage();
  let cpu: NodeJS.CpuUsage = { user: NaN, system: NaN };
  let redis0: Promise<number> = Promise.resolve(NaN);
  let redis1: Promise<number> = Promise.resolve(NaN);
  const w = await measureWindow(
    job,
    () => {
      acquire.clear();
      cycles = 0;
      failures = 0;
      cpu0 = process.cpuUsage();
      redis0 = redisCpu(probes);
    },
    () => {
      cpu = process.cpuUsage(cpu0);
      redis1 = redisCpu(probes);
    },
  );
  const worker = async (i: number) => {
    const h = lib.handle(`bench:u:${job.runId}:${i}`);
    while (!w.stopped()) {
      const t0 = performance.now();
      try {
        await h.acquire();
      } catch {
        if (w.measuring()) failures++;
        continue;
      }
      const t1 = performance.now();
      try {
        await h.release();
      } catch {
        // A failed release is a failed cycle; the worker goes on (its lock expires on its own).
        if (w.measuring()) failures++;
        continue;
      }
      if (w.measuring()) {
        cycles++;
        acquire.add(t1 - t0);
      }
    }
  };
  for (let i = 0; i < job.workers; i++) void worker(i).catch(() => failures++);
  await w.done;
  const s = acquire.summary();
  const redisSeconds = (await redis1) - (await redis0);
  // The child exits right after answering; locks still held just expire (every run uses fresh keys).
  return {
    cyclesPerSec: cycles / (w.elapsed() / 1000),
    acquireP50: s.p50,
    acquireP99: s.p99,
    failures,
    clientCpuUs: (cpu.user + cpu.system) / cycles,
    redisCpuUs: (redisSeconds * 1e6) / cycles,
  };
}

export async function runContended(job: LockJob): Promise<ContendedResult> {
  const libs = await Promise.all(Array.from({ length: job.spec.clients ?? 1 }, () => makeLockLib(job.spec, job.ports)));
  const hold = job.holdMs ?? 1;
  const wait = new Samples();
  const handoff = new Samples();
  const holds = new Samples();
  const perWorker = new Array<number>(job.workers).fill(0);
  let failures = 0;
  let violations = 0;
  let inside = 0;
  // performance.now() when the last holder called release(); consumed by the next acquisition.
  let releasedAt: number | undefined;
  const w = await measureWindow(job, () => {
    wait.clear();
    handoff.clear();
    holds.clear();
    perWorker.fill(0);
    failures = 0;
    violations = 0;
  });
  const key = `bench:c:${job.runId}`;
  const worker = async (i: number) => {
    const h = libs[i % libs.length]!.handle(key);
    while (!w.stopped()) {
      const t0 = performance.now();
      try {
        await h.acquire();
      } catch {
        // A wait that ended in failure is a wait too (node-redlock's defaults give up after ~2 s): left out, the
        // longest waits would be the ones not shown.
        if (w.measuring()) {
          failures++;
          wait.add(performance.now() - t0);
        }
        continue;
      }
      const t1 = performance.now();
      inside++;
      if (inside > 1 && w.measuring()) violations++;
      if (w.measuring()) {
        wait.add(t1 - t0);
        if (releasedAt !== undefined) handoff.add(t1 - releasedAt);
      }
      releasedAt = undefined;
      await sleep(hold);
      const t2 = performance.now();
      inside--;
      if (w.measuring()) {
        perWorker[i]!++;
        holds.add(t2 - t1);
      }
      releasedAt = performance.now();
      try {
        await h.release();
      } catch {
        // a failed release only delays the next holder until the ttl; counted through the section rate
      }
    }
  };
  for (let i = 0; i < job.workers; i++) void worker(i).catch(() => failures++);
  await w.done;
  const sections = perWorker.reduce((a, b) => a + b, 0);
  const ws = wait.summary();
  const hs = handoff.summary();
  return {
    sectionsPerSec: sections / (w.elapsed() / 1000),
    waitP50: ws.p50,
    waitP99: ws.p99,
    waitMax: ws.max,
    failures,
    violations,
    perWorkerMin: Math.min(...perWorker),
    perWorkerMax: Math.max(...perWorker),
    fairness: Math.max(...perWorker) > 0 ? Math.min(...perWorker) / Math.max(...perWorker) : 0,
    handoffP50: hs.p50,
    handoffP99: hs.p99,
    holdMean: holds.summary().mean,
  };
}
