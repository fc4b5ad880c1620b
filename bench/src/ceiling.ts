// The Redis ceiling: redis-benchmark (a C client, no Node in the way) on the commands hasp's hot paths send, so the
// Node numbers can be read as a share of what the server itself does on this machine.
import { Redis } from 'ioredis';
import { ACQUIRE } from '../../packages/core/src/lock/scripts.lua.js';
import { TAKE } from '../../packages/core/src/rate-limit/bucket.lua.js';
import { mergedCommand } from '../../packages/core/src/redis/script.js';
import { runCommand } from './procs.js';

export type CeilingCaseId = 'set-nx-px' | 'evalsha-acquire' | 'evalsha-take' | 'merged-acquire' | 'merged-take';

/** Calls per merged command in the `merged-*` cases: what hasp's busiest connections carry (see BATCH_PER_TICK). */
export const MERGED_CALLS = 8;

export interface CeilingCase {
  id: CeilingCaseId;
  pipeline: number;
}

export interface CeilingResult {
  /** Script calls (or SETs) per second: for a merged case, commands per second × the calls each carries. */
  opsPerSec: number;
  p50: number;
  p99: number;
}

export const CEILING_LABELS: Record<CeilingCaseId, string> = {
  'set-nx-px': 'SET key token NX PX 10000',
  'evalsha-acquire': "EVALSHA hasp lock ACQUIRE (4 keys, fresh key)",
  'evalsha-take': 'EVALSHA hasp bucket TAKE (1 key)',
  'merged-acquire': `EVALSHA hasp merged command: ${MERGED_CALLS} lock ACQUIREs (fresh keys; ops/s counts ACQUIREs)`,
  'merged-take': `EVALSHA hasp merged command: ${MERGED_CALLS} bucket TAKEs (ops/s counts TAKEs)`,
};

/** Loads hasp's scripts into the server, so EVALSHA finds them (hasp itself falls back to EVAL on NOSCRIPT). */
export async function loadScripts(port: number): Promise<void> {
  const redis = new Redis({ port, host: '127.0.0.1' });
  try {
    for (const script of [ACQUIRE, TAKE, merged('merged-acquire').script, merged('merged-take').script]) {
      const sha = (await redis.script('LOAD', script.source)) as string;
      if (sha !== script.sha) throw new Error(`SCRIPT LOAD returned ${sha}, expected ${script.sha}`);
    }
  } finally {
    redis.disconnect();
  }
}

/** One call's keys and arguments: what RedisLockStore.attempt and the Redis bucket send for a single call. */
function callOf(id: 'evalsha-acquire' | 'evalsha-take', n = 0): { keys: string[]; args: string[] } {
  if (id === 'evalsha-acquire') {
    const stem = `hasp:lock:{bench:__rand_int__${n ? `:${n}` : ''}}`;
    // ARGV: token, ttl, owner, fence floor, queue mode '0' (respect the queue; do not join)
    return { keys: [stem, `${stem}:f`, `${stem}:q`, `${stem}:d`], args: ['token-0123456789abcdef0123456789ab', '10000', '', '', '0'] };
  }
  // capacity 1e6, one token per µs: never limited; a take (commit), of cost 1
  return { keys: [`hasp:tb:default:{bench:__rand_int__${n ? `:${n}` : ''}}`], args: ['1000000', '1', '1', '1'] };
}

/**
 * The command hasp sends for MERGED_CALLS calls made together on one connection (under load most calls travel so: a
 * reviewer counted 1,000 lock cycles of 50 workers going out as 323 commands), built by hasp's own code.
 */
function merged(id: 'merged-acquire' | 'merged-take'): ReturnType<typeof mergedCommand> {
  const single = id === 'merged-acquire' ? 'evalsha-acquire' : 'evalsha-take';
  const script = id === 'merged-acquire' ? ACQUIRE : TAKE;
  return mergedCommand(Array.from({ length: MERGED_CALLS }, (_, n) => ({ script, ...callOf(single, n + 1) })));
}

/**
 * The command line of one case. `__rand_int__` (with -r) gives every request its own key (each occurrence its own
 * number), as 50 workers on their own keys do.
 */
function commandOf(id: CeilingCaseId): string[] {
  switch (id) {
    case 'merged-acquire':
    case 'merged-take': {
      const m = merged(id);
      return ['EVALSHA', m.script.sha, String(m.keys.length), ...m.keys, ...m.args.map(String)];
    }
    case 'set-nx-px':
      return ['SET', 'bench:set:__rand_int__', 'token-0123456789abcdef0123456789ab', 'NX', 'PX', '10000'];
    case 'evalsha-acquire':
    case 'evalsha-take': {
      const { keys, args } = callOf(id);
      return ['EVALSHA', (id === 'evalsha-acquire' ? ACQUIRE : TAKE).sha, String(keys.length), ...keys, ...args];
    }
  }
}

/** Runs redis-benchmark with 50 connections for `requests` requests and parses its CSV line. */
export async function runCeiling(port: number, c: CeilingCase, requests: number): Promise<CeilingResult> {
  const args = ['-h', '127.0.0.1', '-p', String(port), '-c', '50', '-n', String(requests), '-P', String(c.pipeline), '-r', '100000000', '--csv', ...commandOf(c.id)];
  const out = await runCommand('redis-benchmark', args, 120_000);
  // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
  const line = out
    .trim()
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l.startsWith('"') && !l.startsWith('"test"'))
    .pop();
  if (!line) throw new Error(`redis-benchmark printed no result:\n${out.slice(-500)}`);
  const cells = [...line.matchAll(/"([^"]*)"/g)].map((m) => m[1]!);
  const num = (i: number) => Number(cells[i]);
  if (!Number.isFinite(num(1))) throw new Error(`cannot parse redis-benchmark output: ${line}`);
  const calls = c.id.startsWith('merged-') ? MERGED_CALLS : 1;
  return { opsPerSec: num(1) * calls, p50: num(4), p99: num(6) };
}
