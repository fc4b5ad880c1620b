// LockStore over N independent Redis masters (the Redlock algorithm). Every operation goes to all nodes at once, each
// bounded by a short per-node timeout, and settles as soon as the quorum outcome is known.
//
// Fencing across nodes that share nothing: each node keeps the last fence it saw for a key. An attempt proposes
// max(stored + 1, floor) on every node it locks; the lease's fence F is the largest proposal among the nodes that
// granted it. If those nodes did not all propose F, F is written back to them and must reach a quorum before the lease
// is handed out. So every lease's fence is stored on a quorum while that lease holds the lock there; the next lease's
// quorum meets it on at least one node, which it can only lock after the earlier lease left that node, and there it
// reads a stored fence >= F: its own fence is larger. The floor (client clock, µs) only matters once a fence key expired.
import { grantTooLate, lockFailed, type LockUnavailableError } from '../errors.js';
import { bounded, boundedAll, type Outcome } from '../redis/call.js';
import { sendNow } from '../redis/script.js';
import { WakeupShare } from '../redis/wakeups.js';
import type { RedisClient } from '../types.js';
import { backoff, makeRoom, RESEND_FIRST_MS, RESEND_MAX_MS } from '../util/bounded.js';
import { monotonicNow } from '../util/clock.js';
import { realSetTimeout } from '../util/real-timers.js';
import { randomToken } from '../util/token.js';
import { driftFor, lockNames, ownerName, parseAttempt, type LockNames } from './redis-store.js';
import { ACQUIRE, EXTEND, extendArgs, holdId, LEAVE, RAISE_FENCE, RELEASE, releaseArgs, REDLOCK_POLL_MS, RESTORE, WAKE } from './scripts.lua.js';
import type { AttemptResult, Held, LockStore } from './store.js';

/** Floor of the default per-node timeout: below it, a loaded but healthy node would count as failed. */
const MIN_NODE_TIMEOUT_MS = 100;

/** How many released leases a store remembers, so that their lock is not restored after the release (see restore). */
const RELEASED_MAX = 1_024;

/** A waiting caller in the key's line: its name there, and its place (client µs), the same on every node. */
interface Place {
  readonly name: string;
  readonly place: number;
  /** Some node refused it, so it is in that node's line (until its release, or its heartbeat lapses). */
  joined: boolean;
}

// Results of rounds that ended in a split vote (no token reached the quorum, and not because the key is held).
const SPLIT_VOTES = new WeakSet<AttemptResult>();
// Split votes that came from lines that disagreed (see attemptOnce).
const LINE_SPLITS = new WeakSet<AttemptResult>();

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
  readonly pollMs = REDLOCK_POLL_MS;
  private readonly wakeups: WakeupShare[];
  /**
   * Leases this store handed out with a fresh lock, until released or past their first validity: a late grant of one
   * of them is kept only while it is live. (A late grant can land after the lease's release on that node: ioredis
   * re-sends commands after a reconnect, and a NOSCRIPT fallback re-sends an acquire after a release behind it.)
   */
  private readonly live = new Map<string, () => void>();
  /** The last fence floor this store proposed, µs. */
  private lastFloor = 0;
  /** Tokens of leases released lately, oldest first: their lock is not restored, and a restore already on its way is undone. */
  private readonly released = new Set<string>();
  /** Each waiting caller's place in the key's line, stamped at its first attempt and sent to every node. */
  private readonly places = new Map<string, Place>();
  /** The last place handed out, µs. */
  private lastPlace = 0;
  /** Leases whose waiter kept its place in the line while it held the lock (see ACQUIRE): lock token → waiter name. */
  private readonly queued = new Map<string, string>();

  constructor(
    private readonly clients: readonly RedisClient[],
    private readonly s: RedlockSettings,
  ) {
    this.wakeups = clients.map((c) => WakeupShare.of(c, s.timeout));
  }

  // Every round draws its own token (see attemptOnce), so the caller's token serves as the waiter's name in the line,
  // where its place is a time it stamps once and sends to every node: all nodes order their lines alike, whichever
  // order the waiters' calls reach them in. (Per-node arrival times would order them differently and split the votes.)
  async attempt(key: string, waiter: string, owner: string, ttl: number, queue: boolean): Promise<AttemptResult> {
    const line = queue ? this.placeOf(waiter) : undefined;
    const began = this.now();
    for (let retry = 0; ; retry++) {
      const round = this.now();
      const result = await this.attemptOnce(key, owner, ttl, line);
      // A split vote means nobody holds the key: retry it here like a node failure, so that two callers colliding
      // with `wait: 0` (a double submit) do not both walk away busy from a free key.
      const split = !(result instanceof Error) && SPLIT_VOTES.has(result);
      if (!(result instanceof Error) && !split) {
        if (!result.ok) return result;
        this.places.delete(waiter);
        // The round's validity counts from the round's start; a grant's ttl counts from the attempt's (AttemptResult).
        return round === began ? result : { ...result, ttl: result.ttl + (round - began) };
      }
      if (retry >= this.s.retryCount) {
        if (split) return result;
        throw result;
      }
      // Lines that disagreed agree now (the round joined every line it was missing from): no need to wait.
      if (!LINE_SPLITS.has(result as AttemptResult)) await delay(this.s.retryDelay + Math.random() * this.s.retryDelay);
    }
  }

  // Out of the line on every node; settles once a quorum has answered (a minority that keeps the name drops it at its
  // heartbeat, and its votes alone cannot hold anyone up).
  async leave(key: string, waiter: string): Promise<void> {
    this.places.delete(waiter);
    const n = lockNames(this.s.prefix, key);
    const keys = [n.lock, n.queue, n.deadlines];
    const args = [waiter];
    await boundedAll(
      this.clients,
      this.nodeTimeout(0),
      (c) => LEAVE.run(c, keys, args),
      Number,
      (o) => this.clients.length - pendingCount(o) >= this.s.quorum,
    );
  }

  async extend(key: string, token: string, ttl: number, held?: Held): Promise<number | null> {
    const n = lockNames(this.s.prefix, key);
    const q = this.s.quorum;
    const timeout = this.nodeTimeout(ttl);
    const keys = [n.lock];
    const args = extendArgs(token, ttl, held?.hold);
    // Nodes that answered, after the round was decided, that they no longer held the lock; then how to restore it there.
    const lateMissing: number[] = [];
    let restore: ((i: number) => void) | undefined;
    // Set once the lease is found lost: a node that kept (and so prolonged) its lock is handed back.
    let drop: ((i: number) => void) | undefined;
    const outcomes = await boundedAll(
      this.clients,
      timeout,
      (c) => EXTEND.run(c, keys, args),
      Number,
      (o) => count(o, (v) => v >= 0) >= q || count(o, (v) => v < 0) > this.clients.length - q,
      (i, v) => {
        if (v >= 0) {
          drop?.(i);
          return;
        }
        if (restore !== undefined) restore(i);
        else lateMissing.push(i);
      },
    );
    const kept = values(outcomes).filter((v) => v >= 0);
    if (kept.length >= q) {
      if (held !== undefined) {
        restore = (i) => this.restore(i, n, token, ttl, held);
        for (const [i, o] of outcomes.entries()) if (o?.ok && o.value < 0) restore(i);
        for (const i of lateMissing) restore(i);
      }
      return kthLargest(kept, q);
    }
    if (count(outcomes, (v) => v < 0) > this.clients.length - q) {
      // Lost: the nodes that kept the lock just prolonged it for nobody (with 2q > N + 1 they alone keep everyone out).
      drop = (i) => void this.releaseOn(this.clients[i]!, n, token, this.s.timeout, held?.hold).catch(() => undefined);
      for (const [i, o] of outcomes.entries()) if (o?.ok && o.value >= 0) drop(i);
      return null;
    }
    throw this.unavailable('extend', key, outcomes);
  }

  async release(key: string, token: string, _from?: unknown, shared = false, hold = '', until?: number): Promise<boolean> {
    // A nested lease's release drops one hold: the lease it shares the token with still holds, and still needs its late
    // grants kept, its lock put back where a node lost it, and its place in line for its own release.
    if (!shared) {
      this.live.get(token)?.();
      makeRoom(this.released, RELEASED_MAX);
      this.released.add(token);
    }
    const n = lockNames(this.s.prefix, key);
    const q = this.s.quorum;
    // Release goes to every node, including those that never answered the acquire, and settles once the answer is
    // known, so a paused node does not hold it up (its RELEASE stays queued and runs when the node resumes).
    // Only a lease that kept a place in line sends the line's names; otherwise a node that freed the lock with waiters
    // refused meanwhile answers 2, and gets a WAKE (see RELEASE).
    const name = shared ? undefined : this.queued.get(token);
    const keys = name === undefined ? [n.lock] : [n.lock, n.queue, n.deadlines];
    const args = releaseArgs(token, hold, name);
    const outcomes = await boundedAll(
      this.clients,
      this.s.timeout,
      (c) => RELEASE.run(c, keys, args),
      Number,
      (o) => {
        const freed = count(o, (v) => v >= 1);
        const failed = failedCount(o);
        const pending = pendingCount(o);
        return freed >= q || failed > this.clients.length - q || pending === 0 || freed + failed + pending < q;
      },
      (i, v) => {
        if (v === 2) this.wakeOn(this.clients[i]!, n);
      },
    );
    for (const [i, o] of outcomes.entries()) if (o?.ok && o.value === 2) this.wakeOn(this.clients[i]!, n);
    // With more nodes failed than a quorum can spare, the outcome is unknown: the caller may retry (nodes that answered
    // return 0 then). Nodes still unheard are no failure: the round settled without them because the answers already
    // tell (enough nodes no longer held the lock).
    if (failedCount(outcomes) > this.clients.length - q) throw this.unavailable('release', key, outcomes);
    // Decided without the nodes that failed (down, or reconnecting: then it never went out there): the lock stays on
    // them until its ttl (with an owner, the hold's), voting against everyone. Sent
    // again to them in the background until they take it or the lease would have ended (harmless where it ran: by
    // token, or by the hold's id).
    const failed = outcomes.flatMap((o, i) => (o !== undefined && !o.ok ? [i] : []));
    if (failed.length > 0 && until !== undefined) this.releaseLater(failed, n, keys, args, until, 0);
    // Out of the line only now: a release sent again after a failure (LeaseImpl.retryRelease) must still take the lease's
    // name out of the line, or the nodes would wake that name, and refuse everyone else, until its heartbeat ran out.
    if (!shared) this.queued.delete(token);
    // Held, as far as anyone can tell: freed somewhere, and no quorum of nodes answered that it no longer held it
    // (nodes that are down may still hold it, as they did when it was acquired).
    const freed = count(outcomes, (v) => v >= 1);
    return freed > 0 && freed + outcomes.filter((o) => o === undefined || !o.ok).length >= q;
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
    return monotonicNow();
  }

  flush(): void {
    for (const client of this.clients) sendNow(client);
  }

  close(): void {
    for (const w of this.wakeups) w.close();
  }

  /**
   * One round of the algorithm: a result, or an Error when nodes failed so that no quorum could be reached.
   *
   * Each round draws a fresh token. A node's reply can land after the round was decided (it was not counted): such a
   * stray grant is kept only if it belongs to the lease the round handed out, and is released otherwise. Because no
   * other round ever uses this token, releasing a stray can never free the lock of a later round of the same caller.
   */
  private async attemptOnce(key: string, owner: string, ttl: number, line: Place | undefined): Promise<AttemptResult | Error> {
    const n = lockNames(this.s.prefix, key);
    const q = this.s.quorum;
    const total = this.clients.length;
    const timeout = this.nodeTimeout(ttl);
    const token = randomToken();
    // The hold this round adds to a lock with an owner: its grants, and only they, are released by this id.
    const hold = holdId(token, owner);
    const started = monotonicNow();
    // The wall clock in µs (other processes' floors are compared with it), but never a floor this store used before: a
    // node whose stored fence is not below the floor takes a slower path (one more fence write), and the ms clock alone
    // would repeat within a millisecond.
    this.lastFloor = Math.max(Date.now() * 1_000, this.lastFloor + 1);
    const floor = String(this.lastFloor);

    // Replies that land after the decision wait here until the verdict (which lease, if any, to keep) is known.
    const decided: { verdict?: (c: RedisClient, r: AttemptResult) => void } = {};
    const strays: [RedisClient, AttemptResult][] = [];
    const stray = (i: number, r: AttemptResult) => {
      const c = this.clients[i]!;
      if (decided.verdict) decided.verdict(c, r);
      else strays.push([c, r]);
    };

    // A caller that does not wait ignores the line: looking would cost every uncontended acquire on every node a call
    // (about a tenth of Redlock's throughput), and it can only take a lock freed a moment before the first waiter's
    // attempt reaches the node. That waiter keeps its place and goes next.
    const keys = line === undefined ? [n.lock, n.fence] : [n.lock, n.fence, n.queue, n.deadlines];
    const args = line === undefined ? [token, ttl, ownerName(owner), floor] : [token, ttl, ownerName(owner), floor, '1', line.name, String(line.place)];
    const outcomes = await boundedAll(
      this.clients,
      timeout,
      (c) => ACQUIRE.run(c, keys, args),
      parseAttempt,
      // Votes count per token (a reentry votes for the lock's existing token). Settle once one token has a quorum; or
      // once none can get one and the answers so far already tell what kind of failure it is (down, busy, split).
      (o) => {
        const { best, pending, failed, busy, busiest } = roundSoFar(o);
        if (best >= q) return true;
        if (best + pending >= q && failed <= total - q && busy <= total - q) return false;
        // Nobody can win this round: settle once the silent nodes cannot change what kind of failure it is (see
        // failureKind), whether they fail, or refuse for any holder.
        if (pending === 0 || failed > total - q) return true;
        if (failed + pending > total - q) return false;
        if (failureKind(failed, busy, busiest, total, q) === 'busy') return true;
        return busy + pending <= total - q || busiest + failed + pending < q;
      },
      stray,
    );
    const grants = grantsOf(outcomes);
    const lockToken = majorityToken(grants);
    const winners = grants.map((g) => (g !== undefined && g.token === lockToken ? g : undefined));
    const won = winners.filter((g) => g !== undefined);

    let result: AttemptResult | Error;
    let fence = 0;
    if (lockToken !== undefined && won.length >= q) {
      fence = Math.max(...won.map((g) => g.fence));
      const recorded = won.every((g) => g.fence === fence) || (await this.raiseFence(n, lockToken, fence, timeout, winners));
      const validity = kthLargest(
        won.map((g) => g.ttl),
        q,
      );
      const elapsed = monotonicNow() - started;
      if (!recorded) {
        result = lockFailed('acquire', key, `could not record the fence on ${q} of ${total} nodes`);
      } else if (validity - elapsed - this.drift(ttl) <= 0) {
        result = grantTooLate(key, elapsed, ttl, this.drift(ttl));
      } else {
        result = { ok: true, token: lockToken, fence, ttl: validity };
        if (hold !== '') result = { ...result, hold };
        // The same owner's lock, re-entered: granted under its holder's token, not this round's.
        if (lockToken !== token) result = { ...result, nested: true };
      }
    } else {
      const busy = outcomes
        .map((o) => (o?.ok && !o.value.ok ? o.value.pttl : undefined))
        .filter((p): p is number => p !== undefined);
      const { failed, busiest } = roundSoFar(outcomes);
      // Granted somewhere while another waiter is first elsewhere: the nodes' lines disagree (a waiter is missing from
      // a node it could not reach). This round joined the line wherever it was missing, so the next one can agree.
      const linesDisagree = line !== undefined && busy.includes(-1) && grants.some((g) => g?.token === token);
      const kind = failureKind(failed, busy.length, busiest, total, q);
      if (kind === 'down') result = this.unavailable('acquire', key, outcomes);
      else if (linesDisagree) {
        result = { ok: false, pttl: Math.floor(this.s.retryDelay * (0.5 + Math.random())) };
        SPLIT_VOTES.add(result);
        LINE_SPLITS.add(result);
      } else if (kind === 'busy') result = { ok: false, pttl: Math.min(...busy) };
      // A split vote (no holder has a quorum): the caller tries again after a pause, as Redlock prescribes.
      else {
        result = { ok: false, pttl: Math.floor(this.s.retryDelay * (0.5 + Math.random())) };
        SPLIT_VOTES.add(result);
      }
    }

    const keep = !(result instanceof Error) && result.ok ? result.token : undefined;
    // A waiter that joined the line somewhere keeps its place there once let in (see ACQUIRE): its release takes it out.
    if (line !== undefined && !line.joined && outcomes.some((o) => o?.ok && !o.value.ok)) line.joined = true;
    if (line?.joined === true && keep === token) {
      makeRoom(this.queued, RELEASED_MAX);
      this.queued.set(token, line.name);
    }
    // A reentry's lock belongs to the outer lease, whose life this round does not see: its late holds are kept.
    const lease = keep === token && !(result instanceof Error) && result.ok ? this.track(token, result.ttl - elapsedSince(started)) : undefined;
    const verdict = (c: RedisClient, r: AttemptResult) => {
      if (!r.ok) return;
      if (r.token !== keep || (lease !== undefined && !lease.live)) {
        this.releaseOn(c, n, r.token, this.s.timeout, hold).catch(() => undefined);
      } else if (r.fence !== fence) {
        // A late node of the lease: give it the agreed fence too, so a nested acquire there reports the same one.
        bounded(c, this.s.timeout, () => RAISE_FENCE.run(c, [n.lock, n.fence], [keep, String(fence)])).catch(
          () => undefined,
        );
      }
    };
    decided.verdict = verdict;
    for (const [c, r] of strays.splice(0)) verdict(c, r);

    // Undo every counted grant that is not the lease's, and (a safety net for replies that never come) our token on
    // every node that did not answer. After a failure the undo on the nodes that did answer is awaited (bounded), so
    // the caller finds nothing left behind on live nodes; silent nodes are not waited for (strays cover them).
    const undo = this.clients.map((c, i) => {
      const g = grants[i];
      if (g !== undefined) return g.token === keep ? undefined : this.releaseOn(c, n, g.token, timeout, hold);
      if (outcomes[i]?.ok || token === keep) return undefined;
      // A nested round that won: a hold it adds to the lock it re-entered is the lease's (RELEASE spares it), one it
      // takes under its own token is a stray.
      this.releaseOn(c, n, token, timeout, hold, keep).catch(() => undefined);
      return undefined;
    });
    if (keep === undefined) await Promise.allSettled(undo);
    else for (const p of undo) p?.catch(() => undefined);
    return result;
  }

  /** Marks `token`'s lease live until it is released or `validity` ms have passed. */
  private track(token: string, validity: number): { live: boolean } {
    const lease = { live: true };
    const end = () => {
      lease.live = false;
      clearTimeout(timer);
      this.live.delete(token);
    };
    const timer = setTimeout(end, Math.max(0, validity));
    timer.unref();
    this.live.set(token, end);
    return lease;
  }

  /**
   * After an extension that kept the lock on a quorum: puts it back on node `i`, which answered that it no longer held
   * it (restarted empty, say), so that a long-held lease keeps its majority while nodes restart one after another.
   * Best effort, and it decides nothing: the extension's outcome counts only the nodes that kept the lock. A node where
   * someone else holds the key is left alone, and so is a lease that has ended by the time a late answer comes. Should
   * the restore run after the lease's release (ioredis re-sends a command after a reconnect), it is undone.
   */
  private restore(i: number, n: LockNames, token: string, ttl: number, held: Held): void {
    // A node that answers long after the extension (it was paused) may find the lease over by then: leave it be.
    // So may a nested lease's release (its token is not among `released`: the lease it nests in holds on).
    if (this.released.has(token) || held.over === true || this.now() >= held.expiresAt) return;
    const c = this.clients[i]!;
    const done = (restored: unknown) => {
      if (Number(restored) === 1 && (this.released.has(token) || held.over === true)) {
        this.releaseOn(c, n, token, this.s.timeout, held.hold).catch(() => undefined);
      }
    };
    const args = [token, ttl, String(held.fence), ownerName(held.owner), held.hold];
    bounded(c, this.s.timeout, () => RESTORE.run(c, [n.lock, n.fence], args), done, done).catch(() => undefined);
  }

  /** Writes the agreed fence to the nodes that granted; true when a quorum recorded it. */
  private async raiseFence(
    n: { lock: string; fence: string },
    token: string,
    fence: number,
    timeout: number,
    winners: readonly (object | undefined)[],
  ): Promise<boolean> {
    const keys = [n.lock, n.fence];
    const args = [token, String(fence)];
    const outcomes = await boundedAll(
      this.clients,
      timeout,
      (c, i) => (winners[i] === undefined ? Promise.resolve(0) : RAISE_FENCE.run(c, keys, args)),
      Number,
      (o) => count(o, (v) => v === 1) >= this.s.quorum,
    );
    return count(outcomes, (v) => v === 1) >= this.s.quorum;
  }

  /**
   * Drops one hold of `token` on one node (a round's stray grant, whose waiter keeps its place in line): of a lock with
   * an owner, the hold named `hold`.
   */
  private releaseOn(c: RedisClient, n: LockNames, token: string, timeout: number, hold = '', spare = ''): Promise<unknown> {
    const args = releaseArgs(token, hold, '', spare);
    return bounded(c, timeout, () => RELEASE.run(c, [n.lock, n.queue, n.deadlines], args));
  }

  /** Sends a release that failed on nodes `nodes` again, backing off, until each takes it or `until` (store clock). */
  private releaseLater(nodes: number[], n: LockNames, keys: string[], args: string[], until: number, delay: number): void {
    const left = until - this.now();
    if (left <= 0) return;
    const next = backoff(delay, RESEND_FIRST_MS, RESEND_MAX_MS);
    const timer = setTimeout(() => {
      const again: number[] = [];
      let pending = nodes.length;
      for (const i of nodes) {
        const c = this.clients[i]!;
        bounded(c, this.s.timeout, () => RELEASE.run(c, keys, args)).then(
          (v) => {
            if (Number(v) === 2) this.wakeOn(c, n);
          },
          () => void again.push(i),
        ).finally(() => {
          if (--pending === 0 && again.length > 0) this.releaseLater(again, n, keys, args, until, next);
        });
      }
    }, Math.min(next, left));
    timer.unref();
  }

  /** Wakes the first waiter in line on one node where the lock is free (after a RELEASE that answered 2). */
  private wakeOn(c: RedisClient, n: LockNames): void {
    bounded(c, this.s.timeout, () => WAKE.run(c, [n.lock, n.queue, n.deadlines], [])).catch(() => undefined);
  }

  /** A waiting caller's place in line: stamped at its first attempt, never twice the same in this store. */
  private placeOf(waiter: string): Place {
    let line = this.places.get(waiter);
    if (line === undefined) {
      // The wall clock, which other processes share (through NTP), in µs, kept unique here. Leaves this map when let
      // in, or in leave(), which the locker calls for every waiter that gives up.
      this.lastPlace = Math.max(this.placeClock() * 1_000, this.lastPlace + 1);
      line = { name: waiter, place: this.lastPlace, joined: false };
      this.places.set(waiter, line);
    }
    return line;
  }

  /** The clock waiters' places come from, epoch ms (a method of its own so that a test can set it apart). */
  private placeClock(): number {
    return Date.now();
  }

  /** The per-node bound of one round. (A long key costs nothing extra: its names are stored under a digest.) */
  private nodeTimeout(ttl: number): number {
    return this.s.nodeTimeout ?? Math.min(this.s.timeout, Math.max(MIN_NODE_TIMEOUT_MS, Math.floor(ttl / 100)));
  }

  private unavailable(what: string, key: string, outcomes: readonly Outcome<unknown>[]): LockUnavailableError {
    const errors = outcomes.map((o, i) => (o === undefined ? `node ${i}: no answer` : o.ok ? undefined : `node ${i}: ${(o.error as Error).message}`));
    const detail = errors.filter(Boolean).join('; ');
    const cause = new AggregateError(
      outcomes.filter((o): o is { ok: false; error: unknown } => o !== undefined && !o.ok).map((o) => o.error),
      detail,
    );
    return lockFailed(what, key, `no quorum of ${this.s.quorum} of ${this.clients.length} nodes (${detail})`, cause);
  }
}

// The counters below run on every node's answer of every round: plain loops, no intermediate arrays.

/**
 * Why a round that nobody won failed: 'down' when too many nodes failed for anyone to reach a quorum; 'busy' when
 * refusals alone keep the caller from one and someone else may hold one (the refusals of one holder, with the failed
 * nodes); else 'split'. "More than N − q refusals" alone means only that this caller cannot win: refusals of different
 * holders (the other callers of a triple submit, each with a minority), or with 2q > N + 1 (N even, or a quorum above a
 * bare majority) even of one, leave room for a split where nobody holds the key, and every caller would walk away busy
 * from a free key. `busiest`: the most refusals by one holder.
 */
function failureKind(failed: number, busy: number, busiest: number, total: number, q: number): 'busy' | 'down' | 'split' {
  if (failed > total - q) return 'down';
  if (busy > total - q && busiest + failed >= q) return 'busy';
  return 'split';
}

function pendingCount(outcomes: readonly Outcome<unknown>[]): number {
  let n = 0;
  for (const o of outcomes) if (o === undefined) n++;
  return n;
}

function failedCount(outcomes: readonly Outcome<unknown>[]): number {
  let n = 0;
  for (const o of outcomes) if (o !== undefined && !o.ok) n++;
  return n;
}

/**
 * An acquire round so far: the most votes for one token, how many nodes are pending, failed, or busy, and the most
 * refusals by one holder.
 */
function roundSoFar(outcomes: readonly Outcome<AttemptResult>[]): {
  best: number;
  pending: number;
  failed: number;
  busy: number;
  busiest: number;
} {
  let best = 0;
  let pending = 0;
  let failed = 0;
  let busy = 0;
  let busiest = 0;
  // Votes per token, and refusals per holder (refusals that name none count as one holder's): a handful of nodes, so
  // counting pairwise beats building a map.
  for (let i = 0; i < outcomes.length; i++) {
    const o = outcomes[i];
    if (o === undefined) pending++;
    else if (!o.ok) failed++;
    else if (!o.value.ok) {
      busy++;
      const holder = o.value.holder;
      let refusals = 0;
      for (const other of outcomes) if (other?.ok && !other.value.ok && other.value.holder === holder) refusals++;
      if (refusals > busiest) busiest = refusals;
    } else {
      const token = o.value.token;
      let votes = 0;
      for (const other of outcomes) if (other?.ok && other.value.ok && other.value.token === token) votes++;
      if (votes > best) best = votes;
    }
  }
  return { best, pending, failed, busy, busiest };
}

type Grant = Extract<AttemptResult, { ok: true }>;

function grantsOf(outcomes: readonly Outcome<AttemptResult>[]): (Grant | undefined)[] {
  return outcomes.map((o) => (o?.ok && o.value.ok ? o.value : undefined));
}

function tally(grants: readonly ({ token: string } | undefined)[]): Map<string, number> {
  const counts = new Map<string, number>();
  for (const g of grants) if (g) counts.set(g.token, (counts.get(g.token) ?? 0) + 1);
  return counts;
}

function values<T>(outcomes: readonly Outcome<T>[]): T[] {
  const out: T[] = [];
  for (const o of outcomes) if (o?.ok) out.push(o.value);
  return out;
}

function count<T>(outcomes: readonly Outcome<T>[], pred: (v: T) => boolean): number {
  let n = 0;
  for (const o of outcomes) if (o?.ok && pred(o.value)) n++;
  return n;
}

/** The k-th largest value: the time for which at least k nodes agree. */
function kthLargest(xs: readonly number[], k: number): number {
  return [...xs].sort((a, b) => b - a)[k - 1] ?? 0;
}

function majorityToken(grants: readonly ({ token: string } | undefined)[]): string | undefined {
  let best: string | undefined;
  let most = 0;
  for (const [token, c] of tally(grants)) {
    if (c > most) {
      best = token;
      most = c;
    }
  }
  return best;
}

function elapsedSince(started: number): number {
  return monotonicNow() - started;
}

// Not unref'd: the caller awaits this call, and a round on clients that have all ended (quit, or their retryStrategy
// gave up) holds no socket, so an unref'd pause would let the process exit with the call never settled.
function delay(ms: number): Promise<void> {
  return new Promise((resolve) => realSetTimeout(resolve, ms));
}
