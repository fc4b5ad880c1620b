// The Redis ceiling: redis-benchmark (a C client, no Node in the way) on the commands hasp's hot paths send, so the
// Node numbers can be read as a share of what the server itself does on this machine.
import { Redis } from 'ioredis';
import { ACQUIRE } from '../../packages/core/src/lock/scripts.lua.js';
import { TAKE } from '../../packages/core/src/rate-limit/bucket.lua.js';
import { runCommand } from './procs.js';

export type CeilingCaseId = 'set-nx-px' | 'evalsha-acquire' | 'evalsha-take';

export interface CeilingCase {
  id: CeilingCaseId;
  pipeline: number;
}

export interface CeilingResult {
  opsPerSec: number;
  p50: number;
  p99: number;
}

export const CEILING_LABELS: Record<CeilingCaseId, string> = {
  'set-nx-px': 'SET key token NX PX 10000',
  'evalsha-acquire': "EVALSHA hasp lock ACQUIRE (4 keys, fresh key)",
  'evalsha-take': 'EVALSHA hasp bucket TAKE (1 key)',
};

/** Loads hasp's scripts into the server, so EVALSHA finds them (hasp itself falls back to EVAL on NOSCRIPT). */
export async function loadScripts(port: number): Promise<void> {
  const redis = new Redis({ port, host: '127.0.0.1' });
  try {
    for (const script of [ACQUIRE, TAKE]) {
      const sha = (await redis.script('LOAD', script.source)) as string;
      if (sha !== script.sha) throw new Error(`SCRIPT LOAD returned ${sha}, expected ${script.sha}`);
    }
  } finally {
    redis.disconnect();
  }
}

/**
 * The command line of one case. `__rand_int__` (with -r) gives every request its own key, as 50 workers on their own
 * keys do; the argument lists are exactly what RedisLockStore.attempt and the Redis bucket send.
 */
function commandOf(id: CeilingCaseId): string[] {
  switch (id) {
    case 'set-nx-px':
      return ['SET', 'bench:set:__rand_int__', 'token-0123456789abcdef0123456789ab', 'NX', 'PX', '10000'];
    case 'evalsha-acquire': {
      const stem = 'hasp:lock:{bench:__rand_int__}';
      // ARGV: token, ttl, owner, fence floor, fence retention, queue mode '0' (respect the queue; do not join), heartbeat
      return ['EVALSHA', ACQUIRE.sha, '4', stem, `${stem}:f`, `${stem}:q`, `${stem}:d`, 'token-0123456789abcdef0123456789ab', '10000', '', '', '0'];
    }
    case 'evalsha-take':
      // capacity 1e6, one token per µs: never limited; a take (commit), of cost 1
      return ['EVALSHA', TAKE.sha, '1', 'hasp:tb:default:{bench:__rand_int__}', '1000000', '1', '1', '1'];
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
  return { opsPerSec: num(1), p50: num(4), p99: num(6) };
}
