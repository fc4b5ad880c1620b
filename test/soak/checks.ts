// Invariant checkers shared by the soak run and the Cluster fault tests (no vitest here): mutual exclusion and fence
// order per lock, bucket admissions per key between data losses, and operations that must settle in bounded time with
// one of the contract's typed errors.
import { HaspError, type HaspErrorCode, type Lease } from '../../packages/core/src/index.js';

/** Keeps the first few examples of a violation for the report. */
const EXAMPLES = 5;

/**
 * Watches critical sections. A violation is a holder entering while another lease on the same lock is still valid
 * (before its `expiresAt`, which extensions move); a section that runs past its own expiry is an overrun, not a
 * violation, since the lock was no longer promised then. Fences must rise in the order holders enter.
 */
export class LockChecker {
  sections = 0;
  exclusionViolations = 0;
  fenceRegressions = 0;
  overruns = 0;
  readonly examples: string[] = [];
  private readonly holders = new Map<string, Lease>();
  private readonly lastFence = new Map<string, number>();

  /** Call first thing inside the critical section; `lock` names the lock (backend and key). */
  enter(lock: string, lease: Lease): void {
    this.sections++;
    const now = Date.now();
    const other = this.holders.get(lock);
    if (other !== undefined && other.token !== lease.token && now < other.expiresAt) {
      this.exclusionViolations++;
      this.example(`${lock}: entered while the lease with fence ${other.fence} had ${other.expiresAt - now} ms left`);
    }
    const last = this.lastFence.get(lock);
    if (last !== undefined && !(lease.fence > last)) {
      this.fenceRegressions++;
      this.example(`${lock}: fence ${lease.fence} after ${last}`);
    }
    this.lastFence.set(lock, lease.fence);
    this.holders.set(lock, lease);
  }

  /** Call last thing inside the critical section. */
  exit(lock: string, lease: Lease): void {
    if (Date.now() >= lease.expiresAt) this.overruns++;
    if (this.holders.get(lock) === lease) this.holders.delete(lock);
  }

  get violations(): number {
    return this.exclusionViolations + this.fenceRegressions;
  }

  private example(text: string): void {
    if (this.examples.length < EXAMPLES) this.examples.push(text);
  }
}

interface Admission {
  start: number;
  end: number;
}

/**
 * Counts bucket admissions per key and checks them against capacity + rate × elapsed. A data loss (a node restarted
 * empty) refills buckets, so the check runs per stretch between losses: an admission counts in a stretch when its
 * request started after the node was dead and its answer came before the next restart began, and the stretch's
 * allowance spans that whole window. Admissions straddling a loss count nowhere, so the check can miss, never invent.
 */
export class BucketChecker {
  admitted = 0;
  denied = 0;
  overAdmissions = 0;
  readonly examples: string[] = [];
  private readonly admissions = new Map<string, Admission[]>();
  private readonly losses = new Map<string, { deadAt: number; restartAt: number }[]>();

  constructor(
    private readonly capacity: number,
    private readonly rate: number,
  ) {}

  /** Records one decision on `key` of `store` (the Redis deployment holding it), with client times around it. */
  record(store: string, key: string, start: number, end: number, allowed: boolean): void {
    if (!allowed) {
      this.denied++;
      return;
    }
    this.admitted++;
    const name = `${store}\u0000${key}`;
    let list = this.admissions.get(name);
    if (!list) this.admissions.set(name, (list = []));
    list.push({ start, end });
  }

  /** `store` lost its data: dead (confirmed exited) at `deadAt`, restart begun at `restartAt`. */
  dataLoss(store: string, deadAt: number, restartAt: number): void {
    let list = this.losses.get(store);
    if (!list) this.losses.set(store, (list = []));
    list.push({ deadAt, restartAt });
  }

  /** Runs the check over everything recorded; returns the number of over-admitting stretches found. */
  check(): number {
    this.overAdmissions = 0;
    for (const [name, list] of this.admissions) {
      const [store, key] = name.split('\u0000') as [string, string];
      const losses = [...(this.losses.get(store) ?? [])].sort((a, b) => a.deadAt - b.deadAt);
      const first = Math.min(...list.map((a) => a.start));
      const last = Math.max(...list.map((a) => a.end));
      for (let j = 0; j <= losses.length; j++) {
        const from = j === 0 ? first : losses[j - 1]!.deadAt;
        const to = j === losses.length ? last : losses[j]!.restartAt;
        if (to <= from) continue;
        const n = list.filter((a) => a.start >= from && a.end <= to).length;
        const allowance = Math.floor(this.capacity + (this.rate * (to - from)) / 1_000);
        if (n > allowance) {
          this.overAdmissions++;
          if (this.examples.length < EXAMPLES) {
            this.examples.push(`${store} ${key}: ${n} admitted in ${to - from} ms, allowance ${allowance}`);
          }
        }
      }
    }
    return this.overAdmissions;
  }
}

/**
 * Runs operations with a time bound each: counts outcomes by kind and error code, counts as a hang every operation
 * still unsettled at its bound, and keeps errors that are not one of the allowed typed errors.
 */
export class OpTracker {
  readonly counts = new Map<string, number>();
  hangs = 0;
  /** Longest settled operation, ms, over all kinds and per kind. */
  slowest = 0;
  readonly slowestByKind = new Map<string, number>();
  untypedCount = 0;
  /** The first few errors that were not an allowed typed error. */
  readonly untyped: unknown[] = [];
  readonly hangExamples: string[] = [];
  private readonly pending = new Set<string>();
  private seq = 0;

  /**
   * Runs `op`; resolves its value, or undefined when it failed with an allowed code. Never rejects.
   * @param kind - e.g. 'redis-lock.using'
   * @param bound - ms within which the operation must settle
   * @param allowed - error codes of the contract this operation may fail with
   */
  async run<T>(kind: string, bound: number, allowed: readonly HaspErrorCode[], op: () => Promise<T>): Promise<T | undefined> {
    const id = `${kind}#${++this.seq}`;
    const started = performance.now();
    let hung = false;
    this.pending.add(id);
    const watchdog = setTimeout(() => {
      hung = true;
      this.hangs++;
      if (this.hangExamples.length < EXAMPLES) this.hangExamples.push(`${id} unsettled after ${bound} ms`);
    }, bound);
    watchdog.unref();
    try {
      const value = await op();
      this.bump(`${kind} ok`);
      return value;
    } catch (error) {
      if (error instanceof HaspError && allowed.includes(error.code)) {
        this.bump(`${kind} ${error.code}`);
      } else {
        this.bump(`${kind} untyped`);
        this.untypedCount++;
        if (this.untyped.length < EXAMPLES) this.untyped.push(error);
      }
      return undefined;
    } finally {
      clearTimeout(watchdog);
      this.pending.delete(id);
      const ms = performance.now() - started;
      if (!hung) {
        this.slowest = Math.max(this.slowest, ms);
        this.slowestByKind.set(kind, Math.max(this.slowestByKind.get(kind) ?? 0, ms));
      }
    }
  }

  /** Operations still running (each one is also a hang once its bound passed). */
  get inFlight(): number {
    return this.pending.size;
  }

  /** Total of the counts whose name matches `pattern`. */
  total(pattern: RegExp): number {
    let n = 0;
    for (const [name, c] of this.counts) if (pattern.test(name)) n += c;
    return n;
  }

  private bump(name: string): void {
    this.counts.set(name, (this.counts.get(name) ?? 0) + 1);
  }
}

/** Counts unhandled rejections while installed. */
export function countUnhandled(): { reasons: unknown[]; stop(): void } {
  const reasons: unknown[] = [];
  const onRejection = (reason: unknown): void => {
    reasons.push(reason);
  };
  process.on('unhandledRejection', onRejection);
  return { reasons, stop: () => process.off('unhandledRejection', onRejection) };
}
