// Small statistics helpers: latency sample sets, percentiles, medians across runs.

/** Collects latency samples (ms) without per-sample allocation. */
export class Samples {
  private buf = new Float64Array(1 << 14);
  private n = 0;

  add(ms: number): void {
    if (this.n === this.buf.length) {
      const next = new Float64Array(this.buf.length * 2);
      next.set(this.buf);
      this.buf = next;
    }
    this.buf[this.n++] = ms;
  }

  get count(): number {
    return this.n;
  }

  clear(): void {
    this.n = 0;
  }

  /** p50 / p99 / max / mean in ms (NaN when empty). */
  summary(): LatencySummary {
    if (this.n === 0) return { n: 0, p50: NaN, p99: NaN, max: NaN, mean: NaN };
    const s = this.buf.slice(0, this.n).sort();
    let sum = 0;
    for (const x of s) sum += x;
    return { n: this.n, p50: pick(s, 0.5), p99: pick(s, 0.99), max: s[s.length - 1]!, mean: sum / s.length };
  }
}

export interface LatencySummary {
  n: number;
  p50: number;
  p99: number;
  max: number;
  mean: number;
}

/** Nearest-rank percentile of sorted values. */
function pick(sorted: Float64Array, q: number): number {
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
  return sorted[i]!;
}

/** Median of finite values (mean of the middle two for an even count); NaN when there are none. */
export function median(xs: readonly number[]): number {
  const v = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (v.length === 0) return NaN;
  const m = v.length >> 1;
  return v.length % 2 ? v[m]! : (v[m - 1]! + v[m]!) / 2;
}

/**
 * Per-field median of several runs' flat numeric records: `{a: 1, b: 2}` × N → `{a: median, b: median}`.
 * Non-numeric fields are taken from the first run.
 */
export function medianRecord<T extends object>(runs: readonly T[]): T {
  const first = runs[0];
  if (first === undefined) throw new Error('no runs');
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(first)) {
    out[k] = typeof v === 'number' ? median(runs.map((r) => (r as Record<string, number>)[k]!)) : v;
  }
  return out as T;
}
