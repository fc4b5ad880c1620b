// Turns one run's medians into the markdown report: the machine, one table per case family with every figure also as a
// ratio to the baseline measured in the same run, and the issue's targets marked PASS or FAIL from those numbers.
import { execFileSync } from 'node:child_process';
import os from 'node:os';
import { Redis } from 'ioredis';
import { CEILING_LABELS, type CeilingCase, type CeilingResult } from './ceiling.js';
import type { Framework, HttpVariant } from './http/apps.js';
import { LIMITS, type Regime } from './http/limits.js';
import type { LoadResult } from './http/load.js';
import { isHasp, type LockSpec, lockLabel } from './locks/libs.js';
import type { ContendedResult, UncontendedResult } from './locks/run.js';
import type { HeapRow, RedisMemoryRow } from './memory.js';

export interface Config {
  quick: boolean;
  rounds: number;
  httpRounds: number;
  ceiling: { requests: number; pipelinedRequests: number };
  locks: { workers: number; warmupMs: number; measureMs: number };
  contended: { workers: number; holdMs: number; warmupMs: number; measureMs: number };
  http: { connections: number; warmupSec: number; seconds: number };
  heap: { requests: number; keys: number };
}

/** One case: every run's numbers, the errors of runs that failed, and the per-field median of the runs. */
export interface Row<C, R> {
  case: C;
  runs: R[];
  errors: string[];
  median: R | null;
}

export interface Meta {
  date: string;
  command: string;
  commit: string;
  cpu: string;
  cores: number;
  memoryGb: number;
  os: string;
  node: string;
  redis: string;
  loadBefore: number[];
  loadAfter?: number[];
  seconds?: number;
}

export interface HttpCaseSpec {
  framework: Framework;
  variant: HttpVariant;
  regime: Regime;
}

/** One HTTP run: the load generator's figures plus CPU per request of the app server and of Redis. */
export interface HttpResult extends LoadResult {
  serverCpuUs: number;
  redisCpuUs: number;
}

export interface Results {
  meta: Meta;
  config: Config;
  ceiling: Row<CeilingCase, CeilingResult>[];
  uncontended: Row<LockSpec, UncontendedResult>[];
  contended: Row<LockSpec, ContendedResult>[];
  http: Row<HttpCaseSpec, HttpResult>[];
  /** `runs`: how many runs each memory case's medians are of (absent in reports of earlier versions: one). */
  memory: { redis: RedisMemoryRow[]; heap: HeapRow[]; runs?: number } | null;
}

/** What the run ran on, so numbers from different machines are never compared by accident. */
export async function machine(redisPort: number, command: string): Promise<Meta> {
  const redis = new Redis({ port: redisPort, host: '127.0.0.1' });
  const info = (await redis.info('server')) as string;
  redis.disconnect();
  let commit = 'unknown';
  try {
    commit = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
    const dirty = execFileSync('git', ['status', '--porcelain', '--', 'packages'], { encoding: 'utf8' }).trim();
    if (dirty) commit += ' (+ uncommitted changes in packages/)';
  } catch {
    // not a git checkout
  }
  const cpus = os.cpus();
  return {
    date: new Date().toISOString(),
    command,
    commit,
    cpu: cpus[0]?.model.trim() ?? 'unknown',
    cores: cpus.length,
    memoryGb: Math.round(os.totalmem() / 2 ** 30),
    os: `${os.type()} ${os.release()} ${os.arch()}`,
    node: process.version,
    redis: /redis_version:(\S+)/.exec(info)?.[1] ?? 'unknown',
    loadBefore: os.loadavg().map((x) => Math.round(x * 100) / 100),
  };
}

// ---------------------------------------------------------------------------------------------------------------------
// Formatting

const int = (x: number | undefined) => (x === undefined || !Number.isFinite(x) ? 'n/a' : Math.round(x).toLocaleString('en-US'));
const ms = (x: number | undefined) => (x === undefined || !Number.isFinite(x) ? 'n/a' : x < 10 ? x.toFixed(2) : x < 100 ? x.toFixed(1) : x.toFixed(0));
const ratio = (x: number | undefined) => (x === undefined || !Number.isFinite(x) ? 'n/a' : `${x.toFixed(2)}×`);
const pct = (x: number) => `${(x * 100).toFixed(x > 0 && x < 0.01 ? 2 : 1)}%`;
const mb = (x: number) => (Number.isFinite(x) ? x.toFixed(1) : 'n/a');

/** A figure with its ratio to the same figure of the baseline row: `1.23 (0.45×)`. */
function vs(x: number | undefined, base: number | undefined, fmt: (x: number | undefined) => string = ms): string {
  const r = x !== undefined && base !== undefined && base > 0 ? x / base : NaN;
  return Number.isFinite(r) ? `${fmt(x)} (${ratio(r)})` : fmt(x);
}

function table(head: string[], rows: string[][]): string {
  const line = (cells: string[]) => `| ${cells.join(' | ')} |`;
  return [line(head), line(head.map(() => '---')), ...rows.map(line)].join('\n');
}

function failed<C, R>(row: Row<C, R>): string {
  return row.errors.length ? ` (${row.errors.length} run(s) failed: ${row.errors[0]!.slice(0, 120)})` : '';
}

// ---------------------------------------------------------------------------------------------------------------------
// Targets

export interface Target {
  name: string;
  measured: string;
  pass: boolean | null;
}

const FRAMEWORK_NAME: Record<Framework, string> = { express: 'Express', koa: 'Koa' };
const VARIANT_NAME: Record<HttpVariant, string> = {
  bare: 'bare (no limiter)',
  hasp: 'hasp rateLimit (Redis)',
  erl: 'express-rate-limit + rate-limit-redis',
  rlf: 'rate-limiter-flexible (RateLimiterRedis)',
  'koa-ratelimit': 'koa-ratelimit (Redis)',
  'hasp-lock': 'hasp withLock (Redis, distinct keys)',
  'redis-get': 'floor: one plain Redis GET per request',
};

/** Variants that are not peer libraries: the baseline, hasp itself, and the floor. */
const NOT_PEERS: readonly HttpVariant[] = ['bare', 'hasp', 'hasp-lock', 'redis-get'];

function bestPeer(rows: Row<LockSpec, UncontendedResult>[], nodes: number): Row<LockSpec, UncontendedResult> | undefined {
  return rows
    .filter((r) => r.case.nodes === nodes && !isHasp(r.case.lib) && r.median)
    .sort((a, b) => b.median!.cyclesPerSec - a.median!.cyclesPerSec)[0];
}

/**
 * Peers among `rows` with no figure (every run failed): a "best peer" or "ahead of every peer" judgment without them
 * could be against the wrong peer, so such a target is not judged, and says why.
 */
function missing<C, R>(rows: Row<C, R>[], name: (c: C) => string): string {
  const gone = rows.filter((r) => !r.median).map((r) => name(r.case));
  return gone.length ? `; not judged: ${gone.join(', ')} failed every run` : '';
}

/** The peer limiters' rows of one framework and regime (failed ones included), and the fastest of those with a figure. */
function httpPeers(rows: Results['http'], framework: Framework, regime: Regime): { all: Results['http']; best: Results['http'][number] | undefined } {
  const all = rows.filter((r) => r.case.framework === framework && r.case.regime === regime && !NOT_PEERS.includes(r.case.variant));
  const best = all.filter((r) => r.median).sort((a, b) => b.median!.reqPerSec - a.median!.reqPerSec)[0];
  return { all, best };
}

function httpRow(rows: Results['http'], framework: Framework, variant: HttpVariant, regime: Regime): HttpResult | undefined {
  return rows.find((r) => r.case.framework === framework && r.case.variant === variant && (variant === 'bare' || r.case.regime === regime))?.median ?? undefined;
}

/** GC noise allowed in the heap check: what pass 2 may add to the heap after GC, MB. */
const HEAP_SLACK_MB = 2;

/** A contended run's fairness: fewest ÷ most critical sections per worker (reports of earlier versions lack the field). */
function fairness(x: ContendedResult): number {
  return x.fairness ?? (x.perWorkerMax > 0 ? x.perWorkerMin / x.perWorkerMax : 0);
}

/**
 * The most 2xx a `flooded` run may hold: hasp's bucket holds at most `capacity` at the window's start and refills at
 * its rate (one second of refill of slack for the window's edges); the peers count fixed windows, which admit up to
 * twice the limit across a window boundary.
 */
function floodedAdmissionCap(variant: HttpVariant, seconds: number): number {
  const { capacity, perMinute } = LIMITS.flooded;
  return variant === 'hasp' ? capacity + (perMinute / 60) * (seconds + 1) : 2 * perMinute;
}

function maxAdmitted(rows: Results['http']): string {
  const n = rows.filter((r) => r.case.variant === 'hasp' && r.case.regime === 'flooded').flatMap((r) => r.runs.map((x) => x.admitted ?? NaN));
  return n.length && n.every(Number.isFinite) ? String(Math.max(...n)) : 'n/a';
}

/** The issue's targets, judged from this run's medians (or every run, where one bad run fails it); `pass: null` when the case did not run. */
export function targets(res: Results): Target[] {
  const out: Target[] = [];
  const add = (name: string, measured: string, pass: boolean | null) => out.push({ name, measured, pass });

  if (res.uncontended.length) {
    for (const [nodes, lib, need] of [
      [1, 'hasp', 1.5],
      [5, 'hasp-redlock', 2],
    ] as const) {
      const hasp = res.uncontended.find((r) => r.case.lib === lib && r.case.nodes === nodes)?.median;
      const peer = bestPeer(res.uncontended, nodes);
      const r = hasp && peer ? hasp.cyclesPerSec / peer.median!.cyclesPerSec : NaN;
      const gone = missing(
        res.uncontended.filter((x) => x.case.nodes === nodes && !isHasp(x.case.lib)),
        lockLabel,
      );
      add(
        `Locks uncontended, ${nodes} node${nodes > 1 ? 's' : ''}: ${lib === 'hasp' ? 'RedisLock' : 'Redlock'} ≥ ${need}× the best peer`,
        (peer ? `${int(hasp?.cyclesPerSec)} vs ${int(peer.median!.cyclesPerSec)} cycles/s (${lockLabel(peer.case)}) = ${ratio(r)}` : 'n/a') + gone,
        Number.isFinite(r) && !gone ? r >= need : null,
      );
    }
  }

  if (res.contended.length) {
    const hasp = res.contended.find((r) => r.case.lib === 'hasp' && single(r.case))?.median;
    const local = res.contended.find((r) => r.case.lib === 'local')?.median;
    const ok = (b: boolean) => (hasp ? b : null);
    add('Contended (RedisLock, 8 workers, 1 ms hold): wait p99 ≤ 20 ms', `${ms(hasp?.waitP99)} ms`, ok((hasp?.waitP99 ?? Infinity) <= 20));
    // Judged on every run, not on the median: one run with failures (or starved workers) is a failure.
    const haspRuns = res.contended.find((r) => r.case.lib === 'hasp' && single(r.case))?.runs ?? [];
    const failedAll = haspRuns.reduce((n, x) => n + x.failures, 0);
    add('Contended: no failed acquisitions within `wait`', `${int(failedAll)} failed (all runs)`, ok(failedAll === 0));
    const fair = Math.min(...haspRuns.map(fairness));
    add(
      'Contended: no worker below 0.7× the busiest',
      `min/max = ${int(hasp?.perWorkerMin)}/${int(hasp?.perWorkerMax)} (median run); least fair run ${ratio(fair)}`,
      ok(fair >= 0.7),
    );
    const share = hasp && local ? hasp.sectionsPerSec / local.sectionsPerSec : NaN;
    add(
      'Contended: critical sections/s within 10% of the 1 ms-hold ceiling (in-process mutex, same run)',
      `${int(hasp?.sectionsPerSec)} vs ${int(local?.sectionsPerSec)} cs/s = ${ratio(share)}`,
      Number.isFinite(share) ? share >= 0.9 : null,
    );
    const violations = res.contended.reduce((n, r) => n + r.runs.reduce((m, x) => m + x.violations, 0), 0);
    add('Contended: no mutual-exclusion violation (every library, every run)', `${violations} violation(s)`, violations === 0);
    // Not in the issue: the same workers split between two clients, as between two processes.
    for (const lib of ['hasp', 'hasp-redlock'] as const) {
      const row = res.contended.find((r) => r.case.lib === lib && !single(r.case));
      if (!row) continue;
      const m = row.median;
      const f = Math.min(...row.runs.map(fairness));
      add(
        `(check) Contended, ${lockLabel(row.case)}: no worker below 0.7× the busiest`,
        `min/max = ${int(m?.perWorkerMin)}/${int(m?.perWorkerMax)} (median run); least fair run ${ratio(f)}`,
        m ? f >= 0.7 : null,
      );
    }
  }

  if (res.http.length) {
    for (const framework of ['express', 'koa'] as const) {
      const bare = httpRow(res.http, framework, 'bare', 'allowed');
      const need = framework === 'express' ? 0.95 : 0.85;
      for (const regime of ['allowed', 'flooded'] as const) {
        const hasp = httpRow(res.http, framework, 'hasp', regime);
        const r = hasp && bare ? hasp.reqPerSec / bare.reqPerSec : NaN;
        const want = regime === 'allowed' ? need : 0.95;
        // The floor puts an allowed figure in context: what one round trip per request leaves, before any limiter logic.
        const floor = regime === 'allowed' ? httpRow(res.http, framework, 'redis-get', 'allowed') : undefined;
        const context = floor && bare ? ` (one plain GET per request: ${ratio(floor.reqPerSec / bare.reqPerSec)})` : '';
        add(`HTTP ${regime}, ${FRAMEWORK_NAME[framework]}: hasp ≥ ${want}× bare`, `${int(hasp?.reqPerSec)} vs ${int(bare?.reqPerSec)} req/s = ${ratio(r)}${context}`, Number.isFinite(r) ? r >= want : null);
      }
      const hasp = httpRow(res.http, framework, 'hasp', 'allowed');
      const { all, best } = httpPeers(res.http, framework, 'allowed');
      const r = hasp && best ? hasp.reqPerSec / best.median!.reqPerSec : NaN;
      const gone = missing(all, (c) => VARIANT_NAME[c.variant]);
      add(
        `HTTP allowed, ${FRAMEWORK_NAME[framework]}: hasp ahead of every peer`,
        (best ? `${int(hasp?.reqPerSec)} vs ${int(best.median!.reqPerSec)} req/s (${VARIANT_NAME[best.case.variant]}) = ${ratio(r)}` : 'n/a') + gone,
        Number.isFinite(r) && !gone ? r > 1 : null,
      );
    }
  }

  if (res.http.length) {
    // Not a target but a validity check: the regimes did what they claim, and nothing failed. In `flooded` a limiter
    // must also admit no more than its limit allows in the measured window (a share of 429s alone would pass a limiter
    // admitting a thousand times its budget).
    const seconds = res.config.http.seconds;
    const bad = res.http.flatMap((r) =>
      r.runs
        .filter((x) => {
          if (x.errors > 0 || x.otherShare > 0) return true;
          if (r.case.regime !== 'flooded' || r.case.variant === 'bare') return x.limitedShare > 0;
          const cap = floodedAdmissionCap(r.case.variant, seconds);
          return x.limitedShare < 0.95 || (x.admitted !== undefined && x.admitted > cap);
        })
        .map((x) => `${r.case.framework} ${r.case.variant} ${r.case.regime}${x.admitted === undefined ? '' : ` (${x.admitted} admitted)`}`),
    );
    add(
      '(check) HTTP runs valid: allowed 0% 429; flooded ≥ 95% 429 and no more admitted than the limit allows; no errors, no other non-2xx',
      bad.length ? `invalid: ${[...new Set(bad)].join(', ')}` : `all runs valid (flooded hasp admitted at most ${maxAdmitted(res.http)} per run)`,
      bad.length === 0,
    );
  }

  if (res.memory) {
    const bucket = res.memory.redis.find((r) => r.what.startsWith('hasp TokenBucket'));
    add('Redis memory per bucket ≤ 80 bytes', bucket ? `${bucket.bytesAfter1} bytes (${bucket.keys.length} key)` : 'n/a', bucket ? bucket.bytesAfter1 <= 80 : null);
    for (const h of res.memory.heap) {
      // Bounded: pass 2 over as many new keys must not add to what pass 1 left (after GC). A store that kept every
      // bucket adds pass 2's (about 14 MB for 200,000 keys, measured with the store's sweep turned off), where a bounded
      // one adds nothing; 2 MB of slack for GC noise. (Not relative to the heap: the key strings the driver holds make
      // it large enough that a slack in proportion hid an unbounded store.)
      const growth = h.afterGc2 - h.afterGc1;
      add(
        `Heap bounded: ${h.what}, ${int(h.requests)} requests over ${int(h.keys)} keys, then as many over new keys: pass 2 adds ≤ ${HEAP_SLACK_MB} MB`,
        `retained ${mb(h.afterGc1 - h.before)} MB after pass 1, ${mb(h.afterGc2 - h.before)} MB after pass 2: pass 2 added ${mb(growth)} MB`,
        growth <= HEAP_SLACK_MB,
      );
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------------------
// Sections

function metaSection(res: Results): string {
  const m = res.meta;
  const c = res.config;
  return [
    `# hasp benchmark${c.quick ? ' (quick smoke run: short windows, one round; not for comparison)' : ''}`,
    '',
    `- Date: ${m.date}`,
    `- Machine: ${m.cpu}, ${m.cores} cores, ${m.memoryGb} GB RAM, ${m.os}`,
    `- Software: Node ${m.node}, Redis ${m.redis}, hasp at ${m.commit}`,
    `- Command: \`${m.command}\` (${m.seconds ?? '?'} s); load average before ${m.loadBefore.join(' / ')}, after ${m.loadAfter?.join(' / ') ?? '?'}`,
    `- Method: every case ran ${c.rounds}× (HTTP cases ${c.httpRounds}×${res.memory && (res.memory.runs ?? 1) !== c.rounds ? `, memory cases ${res.memory.runs ?? 1}×` : ''}) interleaved (round order reversed each round); figures are the median of the runs. ` +
      'Servers (redis-server, the HTTP app) and load generators (lock workers, autocannon) are separate processes, all on this one machine over loopback. ' +
      'Every ratio compares with a baseline measured in the same run.',
  ].join('\n');
}

function ceilingSection(rows: Results['ceiling']): string {
  const base = (pipeline: number) => rows.find((r) => r.case.id === 'set-nx-px' && r.case.pipeline === pipeline)?.median;
  return [
    '## Redis ceiling (redis-benchmark, 50 connections, a fresh key per request)',
    '',
    table(
      ['command', 'pipeline', 'ops/s', '× SET NX PX', 'p50 ms', 'p99 ms'],
      rows.map((r) => {
        const m = r.median;
        const b = base(r.case.pipeline);
        return [CEILING_LABELS[r.case.id] + failed(r), String(r.case.pipeline), int(m?.opsPerSec), ratio(m && b ? m.opsPerSec / b.opsPerSec : NaN), vs(m?.p50, b?.p50), vs(m?.p99, b?.p99)];
      }),
    ),
  ].join('\n');
}

function uncontendedSection(res: Results): string {
  const parts = [
    `## Locks, uncontended (${res.config.locks.workers} workers, each on its own key: acquire + release cycles, no waiting)`,
    '',
    'Baseline: the fastest peer library on the same number of nodes; `(0.45×)` after a figure is its ratio to the same figure ' +
      'of that peer. CPU per cycle: the lock workers\' process, and the ' +
      'Redis servers summed (INFO cpu), over the measured window; on this shared 2-core machine these explain the ' +
      'throughput better than latency does.',
  ];
  for (const nodes of [1, 5]) {
    const rows = res.uncontended.filter((r) => r.case.nodes === nodes);
    if (!rows.length) continue;
    const peer = bestPeer(res.uncontended, nodes)?.median;
    parts.push(
      '',
      `### ${nodes} Redis node${nodes > 1 ? 's' : ''}`,
      '',
      table(
        ['library', 'cycles/s', '× best peer', 'acquire p50 ms', 'acquire p99 ms', 'failed', 'client CPU µs/cycle', 'Redis CPU µs/cycle'],
        rows.map((r) => {
          const m = r.median;
          const name = (isHasp(r.case.lib) ? `**${lockLabel(r.case)}**` : lockLabel(r.case)) + failed(r);
          return [
            name,
            int(m?.cyclesPerSec),
            ratio(m && peer ? m.cyclesPerSec / peer.cyclesPerSec : NaN),
            vs(m?.acquireP50, peer?.acquireP50),
            vs(m?.acquireP99, peer?.acquireP99),
            int(m?.failures),
            vs(m?.clientCpuUs, peer?.clientCpuUs),
            vs(m?.redisCpuUs, peer?.redisCpuUs),
          ];
        }),
      ),
    );
  }
  return parts.join('\n');
}

/** A contended case whose workers share one client (the issue's setting), not split between several. */
function single(spec: LockSpec): boolean {
  return (spec.clients ?? 1) === 1;
}

function contendedSection(res: Results): string {
  const c = res.config.contended;
  const local = res.contended.find((r) => r.case.lib === 'local')?.median;
  return [
    `## Locks, contended (${c.workers} workers on one key, each holding it ~${c.holdMs} ms; 1 Redis node unless named)`,
    '',
    '`default`: the library\'s own retry settings; `tuned`: its fastest polling (node-redlock: retryDelay 2 ms, jitter 1 ms, ' +
      'retryCount 5000; redis-semaphore: retryInterval 1 ms). hasp waits with `wait: 10_000` and is woken by pub/sub. ' +
      'Baseline: a perfect in-process FIFO mutex doing the same 1 ms holds (the ceiling); `(1.50×)` after a figure is its ratio ' +
      'to the ceiling\'s (its waits are the FIFO ideal: seven holds ahead). Hand-off: from the holder calling release() ' +
      'to the next holder returning from acquire(). Failed: acquisitions that gave up (retry budget or wait exhausted). ' +
      'Violations: two holders inside at once (sum over all runs). `2 clients`: the same workers split between two ' +
      'instances of the library with connections of their own, alternately, as between two processes.',
    '',
    table(
      ['library', 'cs/s', '× ceiling', 'wait p50 ms', 'wait p99 ms', 'wait max ms', 'failed', 'cs per worker min / max', 'hand-off p50 ms', 'hand-off p99 ms', 'violations'],
      res.contended.map((r) => {
        const m = r.median;
        const name = (isHasp(r.case.lib) ? `**${lockLabel(r.case)}**` : lockLabel(r.case)) + failed(r);
        const violations = r.runs.reduce((n, x) => n + x.violations, 0);
        return [
          name,
          int(m?.sectionsPerSec),
          ratio(m && local ? m.sectionsPerSec / local.sectionsPerSec : NaN),
          vs(m?.waitP50, local?.waitP50),
          vs(m?.waitP99, local?.waitP99),
          vs(m?.waitMax, local?.waitMax),
          int(m?.failures),
          m ? `${int(m.perWorkerMin)} / ${int(m.perWorkerMax)}` : 'n/a',
          ms(m?.handoffP50),
          ms(m?.handoffP99),
          String(violations),
        ];
      }),
    ),
  ].join('\n');
}

function httpSection(res: Results): string {
  const h = res.config.http;
  const parts = [
    `## HTTP (autocannon, ${h.connections} keep-alive connections, ${h.seconds} s after ${h.warmupSec} s warm-up; server in its own process)`,
    '',
    '`allowed`: 1,000 keys, nothing limited. `flooded`: one key, 100 requests/min allowed, nearly everything answered 429. ' +
      'Baseline: the same framework with no limiter (`bare`); `(1.50×)` after a figure is its ratio to bare\'s. withLock takes a fresh key per request (never waits). ' +
      'The floor is no limiter: one plain `GET` of the key per request on an auto-pipelining ioredis client, what any limiter that asks Redis once per request pays before doing anything. ' +
      'CPU per request: the app server process and the Redis server over the measured window; on a shared 2-core machine ' +
      'the server CPU cost is the steadier measure of middleware overhead, req/s the one the targets use.',
  ];
  for (const framework of ['express', 'koa'] as const) {
    const rows = res.http.filter((r) => r.case.framework === framework);
    if (!rows.length) continue;
    const bare = httpRow(res.http, framework, 'bare', 'allowed');
    parts.push(
      '',
      `### ${FRAMEWORK_NAME[framework]}`,
      '',
      table(
        ['middleware', 'regime', 'req/s', '× bare', 'p50 ms', 'p99 ms', '429', 'other non-2xx', 'errors', 'server CPU µs/req', 'Redis CPU µs/req'],
        rows.map((r) => {
          const m = r.median;
          const name = (r.case.variant.startsWith('hasp') ? `**${VARIANT_NAME[r.case.variant]}**` : VARIANT_NAME[r.case.variant]) + failed(r);
          return [
            name,
            r.case.variant === 'bare' ? '—' : r.case.regime,
            int(m?.reqPerSec),
            ratio(m && bare ? m.reqPerSec / bare.reqPerSec : NaN),
            vs(m?.p50, bare?.p50),
            vs(m?.p99, bare?.p99),
            m ? pct(m.limitedShare) : 'n/a',
            m ? pct(m.otherShare) : 'n/a',
            int(m?.errors),
            vs(m?.serverCpuUs, bare?.serverCpuUs),
            ms(m?.redisCpuUs),
          ];
        }),
      ),
    );
  }
  return parts.join('\n');
}

function memorySection(res: Results): string {
  const mem = res.memory!;
  const hasp = (kind: string) => mem.redis.find((r) => r.kind === kind && r.what.startsWith('hasp'));
  return [
    '## Memory',
    '',
    '### Redis bytes per key (MEMORY USAGE … SAMPLES 0, summed over every key the operation leaves; baseline: hasp)',
    '',
    table(
      ['what', 'keys left', 'bytes after 1 take', 'bytes after 50', '× hasp'],
      mem.redis.map((r) => {
        const b = hasp(r.kind);
        return [r.what, r.keys.map((k) => `\`${k}\``).join(', '), int(r.bytesAfter1), r.bytesAfter50 === null ? '—' : int(r.bytesAfter50), ratio(b ? r.bytesAfter1 / b.bytesAfter1 : NaN)];
      }),
    ),
    '',
    '### Node heap of the in-memory limiters (heapUsed MB, each in a fresh process; baseline: heap before)',
    '',
    `Pass 2 drives ${int(res.config.heap.keys)} new keys after pass 1's buckets refilled. Capacity 10, 10/s: a bucket is full ` +
      'again (and may be forgotten) at most 0.5 s after its last take, so a bounded store holds only recently active keys ' +
      "and pass 2 must not add pass 1's keys on top. The heap also holds the driver's key strings (three sets), the same " +
      'in every figure.',
    '',
    table(
      ['limiter', 'requests per pass', 'keys', 'before', 'after pass 1', 'after GC', 'after pass 2', 'after GC', 'after GC × before', 'pass 1 time'],
      mem.heap.map((h) => [
        h.what,
        int(h.requests),
        int(h.keys),
        mb(h.before),
        mb(h.after1),
        mb(h.afterGc1),
        mb(h.after2),
        mb(h.afterGc2),
        ratio(h.afterGc2 / h.before),
        `${(h.ms / 1000).toFixed(1)} s`,
      ]),
    ),
  ].join('\n');
}

/** The few ratios that sum the run up (also what the root README shows). */
export function headline(res: Results): string {
  const rows: string[][] = [];
  for (const [nodes, lib] of [
    [1, 'hasp'],
    [5, 'hasp-redlock'],
  ] as const) {
    const hasp = res.uncontended.find((r) => r.case.lib === lib && r.case.nodes === nodes)?.median;
    const peer = bestPeer(res.uncontended, nodes);
    if (!hasp || !peer) continue;
    rows.push([
      `Lock acquire + release cycles/s, uncontended, ${nodes} node${nodes > 1 ? 's' : ''}`,
      'best peer',
      `${int(hasp.cyclesPerSec)} (${ratio(hasp.cyclesPerSec / peer.median!.cyclesPerSec)})`,
      `${int(peer.median!.cyclesPerSec)} (1.00×, ${lockLabel(peer.case)})`,
    ]);
  }
  const local = res.contended.find((r) => r.case.lib === 'local')?.median;
  const hc = res.contended.find((r) => r.case.lib === 'hasp' && single(r.case))?.median;
  const peers = res.contended.filter((r) => !isHasp(r.case.lib) && r.case.lib !== 'local' && single(r.case) && r.median);
  const bestCs = [...peers].sort((a, b) => b.median!.sectionsPerSec - a.median!.sectionsPerSec)[0];
  if (local && hc && bestCs) {
    rows.push([
      'Contended critical sections/s (8 workers, 1 ms hold)',
      'in-process mutex',
      `${int(hc.sectionsPerSec)} (${ratio(hc.sectionsPerSec / local.sectionsPerSec)})`,
      `${int(bestCs.median!.sectionsPerSec)} (${ratio(bestCs.median!.sectionsPerSec / local.sectionsPerSec)}, ${lockLabel(bestCs.case)})`,
    ]);
    const fair = (m: ContendedResult) => m.perWorkerMin / m.perWorkerMax;
    const fairest = [...peers].sort((a, b) => fair(b.median!) - fair(a.median!))[0]!;
    rows.push(['Contended fairness: fewest ÷ most critical sections per worker', '—', ratio(fair(hc)), `${ratio(fair(fairest.median!))} (${lockLabel(fairest.case)})`]);
    const steadiest = [...peers].sort((a, b) => a.median!.waitMax - b.median!.waitMax)[0]!;
    rows.push(['Contended longest wait ms (lower is better)', '—', ms(hc.waitMax), `${ms(steadiest.median!.waitMax)} (${lockLabel(steadiest.case)})`]);
  }
  for (const framework of ['express', 'koa'] as const) {
    const bare = httpRow(res.http, framework, 'bare', 'allowed');
    if (!bare) continue;
    for (const regime of ['allowed', 'flooded'] as const) {
      const hasp = httpRow(res.http, framework, 'hasp', regime);
      const peer = httpPeers(res.http, framework, regime).best;
      if (!hasp || !peer) continue;
      rows.push([
        `${FRAMEWORK_NAME[framework]} req/s, rate limit on Redis, ${regime}`,
        'no limiter',
        `${int(hasp.reqPerSec)} (${ratio(hasp.reqPerSec / bare.reqPerSec)})`,
        `${int(peer.median!.reqPerSec)} (${ratio(peer.median!.reqPerSec / bare.reqPerSec)}, ${VARIANT_NAME[peer.case.variant]})`,
      ]);
    }
    const lock = httpRow(res.http, framework, 'hasp-lock', 'allowed');
    if (lock) rows.push([`${FRAMEWORK_NAME[framework]} req/s, withLock on Redis, distinct keys`, 'no limiter', `${int(lock.reqPerSec)} (${ratio(lock.reqPerSec / bare.reqPerSec)})`, '—']);
  }
  if (res.memory) {
    const hasp = res.memory.redis.find((r) => r.kind === 'bucket' && r.what.startsWith('hasp'));
    const peer = res.memory.redis.filter((r) => r.kind === 'bucket' && !r.what.startsWith('hasp')).sort((a, b) => a.bytesAfter1 - b.bytesAfter1)[0];
    if (hasp && peer) rows.push(['Redis bytes per rate-limit key, MEMORY USAGE (lower is better)', '—', int(hasp.bytesAfter1), `${int(peer.bytesAfter1)} (${peer.what})`]);
  }
  if (!rows.length) return '';
  return table(['measure', 'baseline (same run)', 'hasp (× baseline)', 'best peer (× baseline)'], rows);
}

function targetSection(list: Target[]): string {
  const mark = (p: boolean | null) => (p === null ? 'not run' : p ? '**PASS**' : '**FAIL**');
  return ['## Targets (issue 6)', '', table(['target', 'measured', 'result'], list.map((t) => [t.name, t.measured, mark(t.pass)]))].join('\n');
}

/** The whole report. */
export function render(res: Results): string {
  const parts = [metaSection(res)];
  const h = headline(res);
  if (h) parts.push(`## Headline\n\n${h}`);
  const t = targets(res);
  if (t.length) parts.push(targetSection(t));
  if (res.ceiling.length) parts.push(ceilingSection(res.ceiling));
  if (res.uncontended.length) parts.push(uncontendedSection(res));
  if (res.contended.length) parts.push(contendedSection(res));
  if (res.http.length) parts.push(httpSection(res));
  if (res.memory) parts.push(memorySection(res));
  return `${parts.join('\n\n')}\n`;
}

/**
 * The root README's "## Benchmarks" section: when and where, how to reproduce, the headline ratios and the targets.
 * It is the last section of the README, so replacing it never touches the sections above.
 */
export function readmeSection(res: Results): string {
  const m = res.meta;
  const t = targets(res).filter((x) => !x.name.startsWith('(check)'));
  const passing = t.filter((x) => x.pass === true).length;
  const unjudged = t.filter((x) => x.pass === null).length;
  return [
    '## Benchmarks',
    '',
    `Measured ${m.date.slice(0, 16).replace('T', ' ')} UTC on ${m.cpu}, ${m.cores} cores, ${m.memoryGb} GB RAM (${m.os}), ` +
      `Node ${m.node}, Redis ${m.redis}, hasp at ${m.commit}, with \`${m.command}\` (${m.seconds ?? '?'} s; load average ` +
      `before ${m.loadBefore[0]}). Every case ran ${res.config.rounds}× (HTTP ${res.config.httpRounds}×) interleaved; figures are medians, and every ratio ` +
      'compares with a baseline measured in the same run. The machine was shared with other work, so treat small ' +
      'differences as noise.',
    '',
    headline(res),
    '',
    `Targets: ${passing} of ${t.length} pass${unjudged ? ` (${unjudged} not run or not judged)` : ''}. All tables, CPU per operation and the targets: ` +
      `[bench/results/latest.md](bench/results/latest.md). Reproduce with \`pnpm bench\` (about ${m.seconds === undefined ? 8 : Math.round(m.seconds / 60)} minutes; ` +
      '`pnpm bench --quick` for a two-minute smoke run).',
    '',
  ].join('\n');
}
