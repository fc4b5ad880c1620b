// The HTTP load generator, run in its own forked child (never in the server's process): autocannon over keep-alive
// connections, a warm-up run whose numbers are dropped, then the measured run.
import autocannon from 'autocannon';

export interface LoadJob {
  url: string;
  connections: number;
  warmupSec: number;
  seconds: number;
  /** Distinct `x-key` values cycled through by every connection; 1 floods a single key. */
  keys: number;
}

export interface LoadResult {
  reqPerSec: number;
  p50: number;
  p99: number;
  /** Share of responses that were 429. */
  limitedShare: number;
  /** Share of responses that were neither 2xx nor 429 (should be 0). */
  otherShare: number;
  errors: number;
  /** Requests the measured run completed (all status codes). */
  requests: number;
  /** 2xx responses in the measured run: in `flooded`, what the limiter let through (absent in earlier reports). */
  admitted?: number;
}

function run(job: LoadJob, seconds: number): Promise<autocannon.Result> {
  const requests: autocannon.Request[] = [];
  for (let i = 0; i < job.keys; i++) requests.push({ method: 'GET', path: '/', headers: { 'x-key': job.keys === 1 ? 'flood' : `user:${i}` } });
  return new Promise((resolve, reject) => {
    const instance = autocannon({ url: job.url, connections: job.connections, duration: seconds, requests }, (err, result) => {
      if (err) reject(err);
      else resolve(result);
    });
    instance.on('error', reject);
  });
}

/**
 * Warm-up, then `between()` (the parent snapshots the server's and Redis's CPU there), then the measured run.
 */
export async function runLoad(job: LoadJob, between: () => Promise<void> = async () => undefined): Promise<LoadResult> {
  if (job.warmupSec > 0) await run(job, job.warmupSec);
  await between();
  const r = await run(job, job.seconds);
  const codes = (r as unknown as { statusCodeStats: Record<string, { count: number }> }).statusCodeStats ?? {};
  let total = 0;
  let ok = 0;
  let limited = 0;
  for (const [code, { count }] of Object.entries(codes)) {
    total += count;
    if (code.startsWith('2')) ok += count;
    if (code === '429') limited += count;
  }
  return {
    reqPerSec: total / r.duration,
    p50: r.latency.p50,
    p99: r.latency.p99,
    limitedShare: total ? limited / total : 0,
    otherShare: total ? (total - ok - limited) / total : 0,
    errors: r.errors + r.timeouts,
    requests: total,
    admitted: ok,
  };
}
