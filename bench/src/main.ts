// `pnpm bench`: starts private redis-server processes, runs every case in forked children (load generators apart from
// servers), repeats each case in interleaved rounds, and writes the medians as markdown and JSON.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startRedisNodes, stopAll, type RedisNode } from '../../test/harness/redis.js';
import { type CeilingCase, type CeilingResult, loadScripts, runCeiling } from './ceiling.js';
import type { Framework, HttpServerJob, HttpVariant, Regime } from './http/apps.js';
import type { LoadJob, LoadResult } from './http/load.js';
import type { LockJob, ContendedResult, UncontendedResult } from './locks/run.js';
import type { LockLibId, LockSpec } from './locks/libs.js';
import type { HeapRow, RedisMemoryRow } from './memory.js';
import { forkChild, runChild } from './procs.js';
import { type Config, type Results, type Row, machine, render } from './report.js';
import { medianRecord } from './stats.js';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const RESULTS = path.join(HERE, '..', 'results');

const argv = process.argv.slice(2);
const QUICK = argv.includes('--quick') || process.env.BENCH_QUICK === '1';
const onlyArg = argv.find((a) => a.startsWith('--only='));
const SECTIONS = ['ceiling', 'uncontended', 'contended', 'http', 'memory'] as const;
type Section = (typeof SECTIONS)[number];
const ONLY = new Set<Section>(onlyArg ? (onlyArg.slice('--only='.length).split(',') as Section[]) : SECTIONS);
for (const s of ONLY) if (!SECTIONS.includes(s)) throw new RangeError(`--only: unknown section "${s}" (expected ${SECTIONS.join(', ')})`);

const CONFIG: Config = QUICK
  ? {
      quick: true,
      rounds: 1,
      ceiling: { requests: 30_000, pipelinedRequests: 100_000 },
      locks: { workers: 50, warmupMs: 200, measureMs: 700 },
      contended: { workers: 8, holdMs: 1, warmupMs: 200, measureMs: 1_000 },
      http: { connections: 64, warmupSec: 1, seconds: 2 },
      heap: { requests: 200_000, keys: 40_000 },
    }
  : {
      quick: false,
      rounds: 2,
      ceiling: { requests: 150_000, pipelinedRequests: 600_000 },
      locks: { workers: 50, warmupMs: 500, measureMs: 2_000 },
      contended: { workers: 8, holdMs: 1, warmupMs: 500, measureMs: 2_500 },
      http: { connections: 64, warmupSec: 1, seconds: 3 },
      heap: { requests: 1_000_000, keys: 200_000 },
    };

const started = Date.now();
function log(message: string): void {
  const s = ((Date.now() - started) / 1000).toFixed(0).padStart(4);
  process.stderr.write(`[bench ${s}s] ${message}\n`);
}

/**
 * Runs every case `rounds` times, interleaved (round 1: A B C, round 2: C B A, ...), so slow drift of the machine
 * (other load, thermal) spreads over all cases instead of hitting one; returns every case's runs. A case that throws
 * records the error and the run goes on.
 */
async function interleaved<C, R>(what: string, cases: readonly C[], label: (c: C) => string, run: (c: C, round: number) => Promise<R>): Promise<{ runs: R[]; errors: string[] }[]> {
  const out = cases.map(() => ({ runs: [] as R[], errors: [] as string[] }));
  for (let round = 0; round < CONFIG.rounds; round++) {
    const order = cases.map((_, i) => i);
    if (round % 2 === 1) order.reverse();
    for (const [n, i] of order.entries()) {
      const c = cases[i]!;
      log(`${what} round ${round + 1}/${CONFIG.rounds} ${n + 1}/${cases.length}: ${label(c)}`);
      try {
        out[i]!.runs.push(await run(c, round));
      } catch (error) {
        const message = error instanceof Error ? error.message : String(error);
        log(`  failed: ${message.split('\n')[0]}`);
        out[i]!.errors.push(message.split('\n')[0]!);
      }
    }
  }
  return out;
}

function rowsOf<C, R extends object>(cases: readonly C[], results: { runs: R[]; errors: string[] }[]): Row<C, R>[] {
  return cases.map((c, i) => {
    const { runs, errors } = results[i]!;
    return { case: c, runs, errors, median: runs.length ? medianRecord(runs) : null };
  });
}

let runSeq = 0;
const runId = () => `${process.pid}-${++runSeq}`;

async function ceiling(node: RedisNode): Promise<Results['ceiling']> {
  await loadScripts(node.port);
  const cases: CeilingCase[] = [];
  for (const pipeline of [1, 16]) for (const id of ['set-nx-px', 'evalsha-acquire', 'evalsha-take'] as const) cases.push({ id, pipeline });
  const results = await interleaved(
    'ceiling',
    cases,
    (c) => `${c.id} -P ${c.pipeline}`,
    async (c): Promise<CeilingResult> => {
      const r = await runCeiling(node.port, c, c.pipeline > 1 ? CONFIG.ceiling.pipelinedRequests : CONFIG.ceiling.requests);
      // Fresh keys every request: drop them so memory (and the next case) starts clean; keep the scripts.
      await node.flush();
      return r;
    },
  );
  return rowsOf(cases, results);
}

async function uncontended(nodes: RedisNode[]): Promise<Results['uncontended']> {
  const one: LockLibId[] = ['hasp', 'hasp-redlock', 'redlock5', 'redlock4', 'sesame', 'rs-mutex', 'rs-redlock'];
  const five: LockLibId[] = ['hasp-redlock', 'redlock5', 'redlock4', 'sesame', 'rs-redlock'];
  const cases: LockSpec[] = [
    ...one.map((lib) => ({ lib, nodes: 1, mode: 'default' as const, waits: false })),
    ...five.map((lib) => ({ lib, nodes: 5, mode: 'default' as const, waits: false })),
  ];
  const ports = nodes.map((n) => n.port);
  const results = await interleaved(
    'locks uncontended',
    cases,
    (c) => `${c.lib} ${c.nodes} node(s)`,
    (spec) => {
      const job: LockJob = { spec, ports, runId: runId(), workers: CONFIG.locks.workers, warmupMs: CONFIG.locks.warmupMs, measureMs: CONFIG.locks.measureMs };
      return runChild<UncontendedResult>({ kind: 'uncontended', ...job }, 60_000);
    },
  );
  return rowsOf(cases, results);
}

async function contended(nodes: RedisNode[]): Promise<Results['contended']> {
  const cases: LockSpec[] = [
    { lib: 'local', nodes: 1, mode: 'default', waits: true },
    { lib: 'hasp', nodes: 1, mode: 'default', waits: true },
    { lib: 'hasp-redlock', nodes: 5, mode: 'default', waits: true },
  ];
  for (const lib of ['redlock5', 'redlock4', 'sesame', 'rs-mutex'] as const) {
    for (const mode of ['default', 'tuned'] as const) cases.push({ lib, nodes: 1, mode, waits: true });
  }
  const ports = nodes.map((n) => n.port);
  const results = await interleaved(
    'locks contended',
    cases,
    (c) => `${c.lib} ${c.mode} ${c.nodes} node(s)`,
    (spec) => {
      const { workers, holdMs, warmupMs, measureMs } = CONFIG.contended;
      const job: LockJob = { spec, ports, runId: runId(), workers, holdMs, warmupMs, measureMs };
      return runChild<ContendedResult>({ kind: 'contended', ...job }, 60_000);
    },
  );
  return rowsOf(cases, results);
}

interface HttpCase {
  framework: Framework;
  variant: HttpVariant;
  regime: Regime;
}

async function httpCases(node: RedisNode): Promise<Results['http']> {
  const cases: HttpCase[] = [];
  const peers: Record<Framework, HttpVariant[]> = { express: ['hasp', 'erl', 'rlf'], koa: ['hasp', 'rlf', 'koa-ratelimit'] };
  for (const framework of ['express', 'koa'] as const) {
    // `bare` ignores the key, so one bare case per framework is the baseline of both regimes.
    cases.push({ framework, variant: 'bare', regime: 'allowed' });
    for (const regime of ['allowed', 'flooded'] as const) for (const variant of peers[framework]) cases.push({ framework, variant, regime });
    cases.push({ framework, variant: 'hasp-lock', regime: 'allowed' });
  }
  const results = await interleaved(
    'http',
    cases,
    (c) => `${c.framework} ${c.variant} ${c.regime}`,
    async (c): Promise<LoadResult> => {
      await node.flush();
      const serverJob: HttpServerJob = { ...c, redisPort: node.port };
      const server = forkChild({ kind: 'http-server', ...serverJob });
      try {
        const { port } = (await server.next('ready', 30_000)) as { port: number };
        const { connections, warmupSec, seconds } = CONFIG.http;
        const load: LoadJob = { url: `http://127.0.0.1:${port}/`, connections, warmupSec, seconds, keys: c.regime === 'flooded' ? 1 : 1_000 };
        return await runChild<LoadResult>({ kind: 'load', ...load }, (warmupSec + seconds) * 1000 + 30_000);
      } finally {
        await server.stop();
      }
    },
  );
  return rowsOf(cases, results);
}

async function memory(node: RedisNode): Promise<Results['memory']> {
  log('memory: Redis bytes per key');
  await node.flush();
  const redis = await runChild<RedisMemoryRow[]>({ kind: 'redis-memory', port: node.port }, 60_000);
  await node.flush();
  const { requests, keys } = CONFIG.heap;
  log(`memory: Node heap, ${requests} requests over ${keys} keys, in-memory rateLimit`);
  const heap: HeapRow[] = [];
  for (const subject of ['bucket', 'express', 'koa'] as const) {
    heap.push(await runChild<HeapRow>({ kind: 'heap', subject, requests, keys }, 240_000, { nodeArgs: ['--expose-gc'] }));
  }
  return { redis, heap };
}

async function main(): Promise<void> {
  log(`${QUICK ? 'quick smoke run' : 'full run'}: ${[...ONLY].join(', ')}; starting 5 redis-server processes`);
  const nodes = await startRedisNodes(5);
  const meta = await machine(nodes[0]!.port, QUICK ? 'pnpm bench --quick' : 'pnpm bench');
  const results: Results = { meta, config: CONFIG, ceiling: [], uncontended: [], contended: [], http: [], memory: null };
  try {
    if (ONLY.has('ceiling')) results.ceiling = await ceiling(nodes[0]!);
    if (ONLY.has('uncontended')) results.uncontended = await uncontended(nodes);
    if (ONLY.has('contended')) results.contended = await contended(nodes);
    if (ONLY.has('http')) results.http = await httpCases(nodes[0]!);
    if (ONLY.has('memory')) results.memory = await memory(nodes[0]!);
  } finally {
    await stopAll();
  }
  results.meta.seconds = Math.round((Date.now() - started) / 1000);
  results.meta.loadAfter = (await import('node:os')).loadavg().map((x) => Math.round(x * 100) / 100);
  const markdown = render(results);
  process.stdout.write(`${markdown}\n`);
  fs.mkdirSync(RESULTS, { recursive: true });
  // Only a full run replaces the committed report; smoke and partial runs keep their markdown inside their JSON.
  const full = !QUICK && ONLY.size === SECTIONS.length;
  const base = full ? 'latest' : QUICK ? 'quick' : 'partial';
  fs.writeFileSync(path.join(RESULTS, `${base}.json`), `${JSON.stringify({ ...results, markdown }, null, 2)}\n`);
  if (full) fs.writeFileSync(path.join(RESULTS, 'latest.md'), markdown);
  log(`done in ${results.meta.seconds} s; wrote bench/results/${base}.json${full ? ' and latest.md' : ''}`);
}

main().catch(async (error: unknown) => {
  process.stderr.write(`[bench] failed: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
  await stopAll().catch(() => undefined);
  process.exit(1);
});
