// LockStore over N independent Redis masters (the Redlock algorithm). Every operation goes to all nodes at once, each
// bounded by a short per-node timeout, and settles as soon as the quorum outcome is known.
//
// Fencing across nodes that share nothing: each node keeps the last fence it saw for a key. An attempt proposes
// max(stored + 1, floor) on every node it locks; the lease's fence F is the largest proposal among the nodes that
// granted it. If those nodes did not all propose F, F is written back to them and must reach a quorum before the lease
// is handed out. So every lease's fence is stored on a quorum while that lease holds the lock there; the next lease's
// quorum meets it on at least one node, which it can only lock after the earlier lease left that node, and there it
// reads a stored fence >= F: its own fence is larger. The floor (client clock, µs) only matters once a fence key expired.
import { LockUnavailableError } from '../errors.js';
import { bounded } from '../redis/call.js';
import { Wakeups } from '../redis/wakeups.js';
import type { RedisClient } from '../types.js';
import { driftFor, FENCE_RETENTION_MS, lockNames, parseAttempt } from './redis-store.js';
import { ACQUIRE, EXTEND, RAISE_FENCE, RELEASE } from './scripts.lua.js';
import type { AttemptResult, LockStore } from './store.js';

type Outcome<T> = { ok: true; value: T } | { ok: false; error: unknown } | undefined;

export interface RedlockSettings {
  prefix: string;
  timeout: number;
  nodeTimeout: number | undefined;
  driftFactor: number;
  quorum: number;
  retryCount: number;
  retryDelay: number;
}

export class RedlockStore implements LockStore {
  private readonly wakeups: Wakeups[];
  // Tokens whose lease is live; a grant that lands after its attempt gave up is handed back unless listed here.
  private readonly live = new Set<string>();

  constructor(
    private readonly clients: readonly RedisClient[],
    private readonly s: RedlockSettings,
  ) {
    this.wakeups = clients.map((c) => new Wakeups(c, s.timeout));
  }

  // Redlock keeps no waiting line: per-node lines could order waiters differently and split every vote.
  async attempt(key: string, token: string, owner: string, ttl: number): Promise<AttemptResult> {
    for (let retry = 0; ; retry++) {
      const result = await this.attemptOnce(key, token, owner, ttl);
      if (!(result instanceof Error)) return result;
      if (retry >= this.s.retryCount) throw result;
      await delay(this.s.retryDelay + Math.random() * this.s.retryDelay);
    }
  }

  leave(): Promise<void> {
    return Promise.resolve();
  }

  async extend(key: string, token: string, ttl: number): Promise<number | null> {
    const n = lockNames(this.s.prefix, key);
    const q = this.s.quorum;
    const timeout = this.nodeTimeout(ttl);
    const outcomes = await gather(
      this.clients.map((c) => bounded(c, timeout, () => EXTEND.run(c, [n.lock], [token, ttl]).then(Number))),
      (o) => count(o, (v) => v >= 0) >= q || count(o, (v) => v < 0) > this.clients.length - q,
    );
    const kept = values(outcomes).filter((v) => v >= 0);
    if (kept.length >= q) return kthLargest(kept, q);
    if (count(outcomes, (v) => v < 0) > this.clients.length - q) return null;
    throw this.unavailable('extend', outcomes);
  }

  async release(key: string, token: string): Promise<boolean> {
    this.live.delete(token);
    const n = lockNames(this.s.prefix, key);
    // Release goes to every node, including those that never answered the acquire, and waits for all (bounded).
    const outcomes = await gather(
      this.clients.map((c) => bounded(c, this.s.timeout, () => RELEASE.run(c, [n.lock, n.queue, n.deadlines], [token, n.channel, '']).then(Number))),
      () => false,
    );
    const answered = values(outcomes);
    if (answered.length < this.s.quorum && count(outcomes, (v) => v === 1) === 0) throw this.unavailable('release', outcomes);
    return count(outcomes, (v) => v === 1) >= this.s.quorum;
  }

  async listen(key: string, wake: (next: string) => void): Promise<() => void> {
    const channel = lockNames(this.s.prefix, key).channel;
    const stops: (() => void)[] = [];
    let stopped = false;
    const subs = this.wakeups.map((w) =>
      w.listen(channel, wake).then((stop) => {
        if (stopped) stop();
        else stops.push(stop);
      }),
    );
    // One live subscription is enough to hear a release (every node publishes it); a slow node must not delay waiting.
    await Promise.any(subs);
    return () => {
      stopped = true;
      for (const stop of stops.splice(0)) stop();
    };
  }

  drift(ttl: number): number {
    return driftFor(ttl, this.s.driftFactor);
  }

  now(): number {
    return Date.now();
  }

  close(): void {
    for (const w of this.wakeups) w.close();
  }

  /** One round of the algorithm: a result, or an Error when nodes failed so that no quorum could be reached. */
  private async attemptOnce(key: string, token: string, owner: string, ttl: number): Promise<AttemptResult | Error> {
    const n = lockNames(this.s.prefix, key);
    const q = this.s.quorum;
    const total = this.clients.length;
    const timeout = this.nodeTimeout(ttl);
    const floor = String(Date.now() * 1_000);
    const started = Date.now();
    const handBack = (c: RedisClient) => (late: unknown) => {
      const r = parseAttempt(late);
      if (r.ok && r.token === token && !this.live.has(token)) {
        RELEASE.run(c, [n.lock, n.queue, n.deadlines], [token, n.channel, '']).catch(() => undefined);
      }
    };
    const outcomes = await gather(
      this.clients.map((c) =>
        bounded(
          c,
          timeout,
          () => ACQUIRE.run(c, [n.lock, n.fence, n.queue, n.deadlines], [token, ttl, owner, floor, FENCE_RETENTION_MS, '', 0]).then(parseAttempt),
          handBack(c),
        ),
      ),
      (o) => {
        const granted = count(o, (r) => r.ok);
        const refused = o.filter((x) => x !== undefined && !(x.ok && x.value.ok)).length;
        return granted >= q || refused > total - q;
      },
    );
    const grants = outcomes.map((o) => (o?.ok && o.value.ok ? o.value : undefined));
    // Reentry returns the lock's existing token; count agreement per token.
    const lockToken = majorityToken(grants);
    const winners = grants.map((g) => (g?.token === lockToken ? g : undefined));
    const won = winners.filter((g) => g !== undefined);
    if (lockToken !== undefined && won.length >= q) {
      const fence = Math.max(...won.map((g) => g.fence));
      if (won.some((g) => g.fence !== fence)) {
        const ok = await this.raiseFence(n, lockToken, fence, timeout, winners);
        if (!ok) {
          await this.undo(key, token, grants);
          return new LockUnavailableError(`lock acquire failed: could not record the fence on ${q} of ${total} nodes`);
        }
      }
      const validity = kthLargest(
        won.map((g) => g.ttl),
        q,
      );
      const elapsed = Date.now() - started;
      if (validity - elapsed - this.drift(ttl) > 0) {
        this.live.add(lockToken);
        return { ok: true, token: lockToken, fence, ttl: validity };
      }
      await this.undo(key, token, grants);
      return new LockUnavailableError(`lock acquire took ${elapsed} ms, longer than the ttl allows`);
    }
    await this.undo(key, token, grants);
    const busy = outcomes
      .map((o) => (o?.ok && !o.value.ok ? o.value.pttl : undefined))
      .filter((p): p is number => p !== undefined);
    const failed = outcomes.filter((o) => o === undefined || !o.ok).length;
    if (failed > total - q) return this.unavailable('acquire', outcomes);
    if (busy.length > total - q) return { ok: false, pttl: Math.min(...busy) };
    // A split vote (no holder has a quorum): try again after a random pause, as Redlock prescribes.
    return { ok: false, pttl: Math.floor(this.s.retryDelay * (0.5 + Math.random())) };
  }

  /** Writes the agreed fence to the nodes that granted; true when a quorum recorded it. */
  private async raiseFence(
    n: { lock: string; fence: string },
    token: string,
    fence: number,
    timeout: number,
    winners: readonly (object | undefined)[],
  ): Promise<boolean> {
    const outcomes = await gather(
      this.clients.map((c, i) =>
        winners[i] === undefined
          ? Promise.resolve(0)
          : bounded(c, timeout, () => RAISE_FENCE.run(c, [n.lock, n.fence], [token, String(fence), FENCE_RETENTION_MS]).then(Number)),
      ),
      (o) => count(o, (v) => v === 1) >= this.s.quorum,
    );
    return count(outcomes, (v) => v === 1) >= this.s.quorum;
  }

  /**
   * After a failed round: drop our fresh lock everywhere, silent nodes included, and the hold a reentry added
   * wherever a node reported one.
   */
  private async undo(key: string, token: string, grants: readonly ({ token: string } | undefined)[]): Promise<void> {
    const n = lockNames(this.s.prefix, key);
    await Promise.allSettled(
      this.clients.map((c, i) => {
        const t = grants[i]?.token ?? token;
        return bounded(c, this.s.timeout, () => RELEASE.run(c, [n.lock, n.queue, n.deadlines], [t, n.channel, '']));
      }),
    );
  }

  private nodeTimeout(ttl: number): number {
    return this.s.nodeTimeout ?? Math.min(this.s.timeout, Math.max(10, Math.floor(ttl / 100)));
  }

  private unavailable(what: string, outcomes: readonly Outcome<unknown>[]): LockUnavailableError {
    const errors = outcomes.map((o, i) => (o === undefined ? `node ${i}: no answer` : o.ok ? undefined : `node ${i}: ${(o.error as Error).message}`));
    const detail = errors.filter(Boolean).join('; ');
    const cause = new AggregateError(
      outcomes.filter((o): o is { ok: false; error: unknown } => o !== undefined && !o.ok).map((o) => o.error),
      detail,
    );
    return new LockUnavailableError(`lock ${what} failed: no quorum of ${this.s.quorum} of ${this.clients.length} nodes (${detail})`, { cause });
  }
}

/** Runs all promises; resolves with what settled so far once `done` says so, or when all have settled. */
function gather<T>(promises: readonly Promise<T>[], done: (outcomes: readonly Outcome<T>[]) => boolean): Promise<Outcome<T>[]> {
  const outcomes: Outcome<T>[] = promises.map(() => undefined);
  let left = promises.length;
  return new Promise((resolve) => {
    let finished = false;
    const check = () => {
      if (finished) return;
      if (left === 0 || done(outcomes)) {
        finished = true;
        resolve(outcomes.slice());
      }
    };
    promises.forEach((p, i) => {
      p.then(
        (value) => {
          if (!finished) outcomes[i] = { ok: true, value };
          left--;
          check();
        },
        (error: unknown) => {
          if (!finished) outcomes[i] = { ok: false, error };
          left--;
          check();
        },
      );
    });
    check();
  });
}

function values<T>(outcomes: readonly Outcome<T>[]): T[] {
  return outcomes.flatMap((o) => (o?.ok ? [o.value] : []));
}

function count<T>(outcomes: readonly Outcome<T>[], pred: (v: T) => boolean): number {
  return values(outcomes).filter(pred).length;
}

/** The k-th largest value: the time for which at least k nodes agree. */
function kthLargest(xs: readonly number[], k: number): number {
  return [...xs].sort((a, b) => b - a)[k - 1] ?? 0;
}

function majorityToken(grants: readonly ({ token: string } | undefined)[]): string | undefined {
  const counts = new Map<string, number>();
  let best: string | undefined;
  for (const g of grants) {
    if (!g) continue;
    const c = (counts.get(g.token) ?? 0) + 1;
    counts.set(g.token, c);
    if (best === undefined || c > (counts.get(best) ?? 0)) best = g.token;
  }
  return best;
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms).unref());
}
