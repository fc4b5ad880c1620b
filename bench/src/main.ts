// `pnpm bench`: starts private redis-server processes, runs every case in forked children (load generators apart from
// servers), repeats each case in interleaved rounds, and writes the medians as markdown and JSON.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Redis } from 'ioredis';
import { startRedisNodes, stopAll, type RedisNode } from '../../test/harness/redis.js';
import { type CeilingCase, type CeilingResult, loadScripts, runCeiling } from './ceiling.js';
import type { Framework, HttpServerJob, HttpVariant, Regime } from './http/apps.js';
import type { LoadJob, LoadResult } from './http/load.js';
import type { LockJob, ContendedResult, UncontendedResult } from './locks/run.js';
import type { LockLibId, LockSpec } from './locks/libs.js';
import type { HeapRow, HeapSubject, RedisMemoryRow } from './memory.js';
import { forkChild, runChild } from './procs.js';
import { type Config, type HttpResult, type Results, type Row, machine, readmeSection, render } from './report.js';
import { medianRecord } from './stats.js';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const RESULTS = path.join(HERE, '..', 'results');

const argv = process.argv.slice(2);
// Anything else (a typo, or `--only ceiling` with a space) would otherwise start a full run that replaces latest.md.
for (const a of argv) {
  // `--` is what `pnpm run bench -- --quick` passes on before the arguments.
  if (!['--', '--quick', '--readme', '--render'].includes(a) && !/^--(?:only|match)=./.test(a)) {
    throw new Error(`unknown argument "${a}": expected --quick, --only=<sections>, --match=<text>, --readme, --render (see bench/README.md)`);
  }
}
const QUICK = argv.includes('--quick') || process.env.BENCH_QUICK === '1';
/** `--readme`: after a full run, replace the "## Benchmarks" section at the end of the root README.md. */
const README = argv.includes('--readme');
const onlyArg = argv.find((a) => a.startsWith('--only='));
const SECTIONS = ['ceiling', 'uncontended', 'contended', 'http', 'memory'] as const;
type Section = (typeof SECTIONS)[number];
const ONLY = new Set<Section>(onlyArg ? (onlyArg.slice('--only='.length).split(',') as Section[]) : SECTIONS);
/** `--match=text`: only cases whose label contains `text` (for development; such runs never replace latest.md). */
const MATCH = argv.find((a) => a.startsWith('--match='))?.slice('--match='.length);
/** Only a full run replaces the committed report (and may write the README section). */
const FULL = !QUICK && !onlyArg && MATCH === undefined;
if (README && !FULL && !argv.includes('--render')) throw new Error('--readme needs a full run (no --quick, --only or --match)');
for (const s of ONLY) if (!SECTIONS.includes(s)) throw new RangeError(`--only: unknown section "${s}" (expected ${SECTIONS.join(', ')})`);

const CONFIG: Config = QUICK
  ? {
      quick: true,
      rounds: 1,
      httpRounds: 1,
      ceiling: { requests: 20_000, pipelinedRequests: 60_000 },
      locks: { workers: 50, warmupMs: 100, measureMs: 400 },
      contended: { workers: 8, holdMs: 1, warmupMs: 100, measureMs: 600 },
      http: { connections: 64, warmupSec: 0.3, seconds: 0.7 },
      heap: { requests: 200_000, keys: 40_000 },
    }
  : {
      quick: false,
      rounds: 2,
      // HTTP is the noisiest family on a shared machine: three rounds, so the median is a real median.
      httpRounds: 3,
      ceiling: { requests: 60_000, pipelinedRequests: 250_000 },
      locks: { workers: 50, warmupMs: 500, measureMs: 1_500 },
      contended: { workers: 8, holdMs: 1, warmupMs: 500, measureMs: 2_000 },
      http: { connections: 64, warmupSec: 0.75, seconds: 2.5 },
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
async function interleaved<C, R>(
  what: string,
  all: readonly C[],
  label: (c: C) => string,
  run: (c: C, round: number) => Promise<R>,
  rounds = CONFIG.rounds,
): Promise<{ cases: C[]; results: { runs: R[]; errors: string[] }[] }> {
  const cases = MATCH === undefined ? [...all] : all.filter((c) => label(c).includes(MATCH));
  const out = cases.map(() => ({ runs: [] as R[], errors: [] as string[] }));
  for (let round = 0; round < rounds; round++) {
    const order = cases.map((_, i) => i);
    if (round % 2 === 1) order.reverse();
    for (const [n, i] of order.entries()) {
      const c = cases[i]!;
      log(`${what} round ${round + 1}/${rounds} ${n + 1}/${cases.length}: ${label(c)}`);
      // One retry: on a shared machine a run can fail for reasons outside it (e.g. packages being rebuilt meanwhile).
      for (let attempt = 1; ; attempt++) {
        try {
          out[i]!.runs.push(await run(c, round));
          break;
        } catch (error) {
          const message = (error instanceof Error ? error.message : String(error)).split('\n')[0]!;
          log(`  failed (attempt ${attempt}): ${message}`);
          if (attempt >= 2) {
            out[i]!.errors.push(message);
            break;
          }
          await new Promise((resolve) => setTimeout(resolve, 2_000));
        }
      }
    }
  }
  return { cases, results: out };
}

function rowsOf<C, R extends object>({ cases, results }: { cases: C[]; results: { runs: R[]; errors: string[] }[] }): Row<C, R>[] {
  return cases.map((c, i) => {
    const { runs, errors } = results[i]!;
    return { case: c, runs, errors, median: runs.length ? medianRecord(runs) : null };
  });
}

/** CPU seconds a Redis server has used (INFO cpu: user + sys). */
async function redisCpuSeconds(port: number): Promise<number> {
  const redis = new Redis({ port, host: '127.0.0.1' });
  try {
    const info = await redis.info('cpu');
    return Number(/used_cpu_user:([\d.]+)/.exec(info)?.[1]) + Number(/used_cpu_sys:([\d.]+)/.exec(info)?.[1]);
  } finally {
    redis.disconnect();
  }
}

let runSeq = 0;
const runId = () => `${process.pid}-${++runSeq}`;

async function ceiling(node: RedisNode): Promise<Results['ceiling']> {
  await loadScripts(node.port);
  const cases: CeilingCase[] = [];
  for (const pipeline of [1, 16]) for (const id of ['set-nx-px', 'evalsha-acquire', 'evalsha-take'] as const) cases.push({ id, pipeline });
  // What hasp sends under load: calls merged into one command (instead of pipelined).
  for (const id of ['merged-acquire', 'merged-take'] as const) cases.push({ id, pipeline: 1 });
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
  return rowsOf(results);
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
  return rowsOf(results);
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
  // The same workers split between two clients, as between two processes: whether waiters take turns across them.
  cases.push(
    { lib: 'hasp', nodes: 1, mode: 'default', waits: true, clients: 2 },
    { lib: 'hasp-redlock', nodes: 5, mode: 'default', waits: true, clients: 2 },
    { lib: 'redlock5', nodes: 1, mode: 'tuned', waits: true, clients: 2 },
  );
  const ports = nodes.map((n) => n.port);
  const results = await interleaved(
    'locks contended',
    cases,
    (c) => `${c.lib} ${c.mode} ${c.nodes} node(s)${(c.clients ?? 1) > 1 ? ` ${c.clients} clients` : ''}`,
    (spec) => {
      const { workers, holdMs, warmupMs, measureMs } = CONFIG.contended;
      const job: LockJob = { spec, ports, runId: runId(), workers, holdMs, warmupMs, measureMs };
      return runChild<ContendedResult>({ kind: 'contended', ...job }, 60_000);
    },
  );
  return rowsOf(results);
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
    cases.push({ framework, variant: 'redis-get', regime: 'allowed' });
  }
  const results = await interleaved(
    'http',
    cases,
    (c) => `${c.framework} ${c.variant} ${c.regime}`,
    async (c): Promise<HttpResult> => {
      await node.flush();
      const serverJob: HttpServerJob = { ...c, redisPort: node.port };
      const { connections, warmupSec, seconds } = CONFIG.http;
      const job: Omit<LoadJob, 'url'> = { connections, warmupSec, seconds, keys: c.regime === 'flooded' ? 1 : 1_000 };
      // Both children start together (each spends about a second loading modules); the load waits for the address.
      const server = forkChild({ kind: 'http-server', ...serverJob });
      const load = forkChild({ kind: 'load', ...job });
      try {
        const { port } = (await server.next('ready', 30_000)) as { port: number };
        load.send({ url: `http://127.0.0.1:${port}/` });
        await load.next('ready', warmupSec * 1000 + 30_000);
        const cpu = async () => {
          server.send({ type: 'cpu' });
          const u = (await server.next('result', 10_000)) as NodeJS.CpuUsage;
          return { server: u.user + u.system, redis: await redisCpuSeconds(node.port) };
        };
        const before = await cpu();
        load.send({ type: 'go' });
        const result = (await load.next('result', seconds * 1000 + 30_000)) as LoadResult;
        const after = await cpu();
        return {
          ...result,
          serverCpuUs: (after.server - before.server) / result.requests,
          redisCpuUs: ((after.redis - before.redis) * 1e6) / result.requests,
        };
      } finally {
        await Promise.all([load.stop(), server.stop()]);
      }
    },
    CONFIG.httpRounds,
  );
  return rowsOf(results);
}

type MemoryCase = { kind: 'redis-bytes' } | { kind: 'heap'; subject: HeapSubject };

async function memory(node: RedisNode): Promise<Results['memory']> {
  const { requests, keys } = CONFIG.heap;
  const cases: MemoryCase[] = [{ kind: 'redis-bytes' }, ...(['bucket', 'express', 'koa'] as const).map((subject) => ({ kind: 'heap' as const, subject }))];
  const results = await interleaved(
    'memory',
    cases,
    (c) => (c.kind === 'redis-bytes' ? 'redis bytes per key' : `heap ${c.subject}, ${requests} requests over ${keys} keys`),
    async (c): Promise<RedisMemoryRow[] | HeapRow> => {
      if (c.kind === 'heap') return runChild<HeapRow>({ kind: 'heap', subject: c.subject, requests, keys }, 240_000, { nodeArgs: ['--expose-gc'] });
      await node.flush();
      try {
        return await runChild<RedisMemoryRow[]>({ kind: 'redis-memory', port: node.port }, 60_000);
      } finally {
        await node.flush();
      }
    },
  );
  const redis: RedisMemoryRow[] = [];
  const heap: HeapRow[] = [];
  results.cases.forEach((c, i) => {
    const runs = results.results[i]!.runs;
    if (runs.length === 0) return;
    if (c.kind === 'heap') heap.push(medianRecord(runs as HeapRow[]));
    // Row by row: the same operations in the same order every run (bytes are exact; the median only guards a stray run).
    else redis.push(...(runs[0] as RedisMemoryRow[]).map((row, r) => medianRecord((runs as RedisMemoryRow[][]).map((run) => run[r]!))));
  });
  return { redis, heap, runs: results.cases.length ? CONFIG.rounds : 0 };
}

async function main(): Promise<void> {
  log(`${QUICK ? 'quick smoke run' : FULL ? 'full run' : 'partial run'}: ${[...ONLY].join(', ')}; starting 5 redis-server processes`);
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
  const full = FULL;
  const base = full ? 'latest' : QUICK ? 'quick' : 'partial';
  fs.writeFileSync(path.join(RESULTS, `${base}.json`), `${JSON.stringify({ ...results, markdown }, null, 2)}\n`);
  if (full) fs.writeFileSync(path.join(RESULTS, 'latest.md'), markdown);
  if (README) writeReadme(results);
  log(`done in ${results.meta.seconds} s; wrote bench/results/${base}.json${full ? ' and latest.md' : ''}`);
}

/** Replaces the "## Benchmarks" section of the root README (up to the next "## " heading), or appends it. */
function writeReadme(results: Results): void {
  const file = path.join(HERE, '..', '..', 'README.md');
  const text = fs.readFileSync(file, 'utf8');
  const at = text.search(/^## Benchmarks$/m);
  let next = at < 0 ? -1 : text.slice(at + 1).search(/^## /m);
  if (next >= 0) next += at + 1;
  const section = readmeSection(results);
  const updated = at < 0 ? `${text.trimEnd()}\n\n${section}` : `${text.slice(0, at)}${section}${next < 0 ? '' : `\n${text.slice(next)}`}`;
  fs.writeFileSync(file, updated);
  log('replaced the "## Benchmarks" section of README.md');
}

/** `--render`: rebuild results/latest.md (and with `--readme` the README section) from results/latest.json, running nothing. */
function renderOnly(): void {
  const file = path.join(RESULTS, 'latest.json');
  // The JSON is not committed: only a full run on this checkout writes it.
  if (!fs.existsSync(file)) throw new Error(`${file} not found: --render re-renders what a full run on this checkout wrote (the JSON is not committed); run \`pnpm bench\` first`);
  const results = JSON.parse(fs.readFileSync(file, 'utf8')) as Results;
  fs.writeFileSync(path.join(RESULTS, 'latest.md'), render(results));
  if (README) writeReadme(results);
  log('re-rendered bench/results/latest.md from latest.json');
}

(argv.includes('--render') ? Promise.resolve().then(renderOnly) : main()).catch(async (error: unknown) => {
  process.stderr.write(`[bench] failed: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
  await stopAll().catch(() => undefined);
  process.exit(1);
});
