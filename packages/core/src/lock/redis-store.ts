// LockStore over one Redis node or Cluster: each operation is one script call, bounded in time.
import { lockFailed } from '../errors.js';
import { bounded } from '../redis/call.js';
import { encodeKey, keyStem } from '../redis/keys.js';
import { sendNow, unexpectedReply } from '../redis/script.js';
import { WakeupShare } from '../redis/wakeups.js';
import type { RedisClient } from '../types.js';
import { backoff, makeRoom, RESEND_FIRST_MS, RESEND_MAX_MS } from '../util/bounded.js';
import { monotonicNow } from '../util/clock.js';
import { ACQUIRE, EXTEND, extendArgs, holdId, LEAVE, LINE_ONLY, RELEASE, releaseArgs, TRANSFER } from './scripts.lua.js';
import type { AttemptResult, Grant, Held, LockStore, Releasing } from './store.js';

export { FENCE_RETENTION_MS, QUEUE_HEARTBEAT_MS } from './scripts.lua.js';

/** Drift allowance shared by the Redis backends: ttl × factor + 2 ms. */
export function driftFor(ttl: number, factor: number): number {
  return Math.floor(ttl * factor) + 2;
}

/** Redis names of one lock key. */
export function lockNames(prefix: string, key: string): LockNames {
  const stem = keyStem(prefix, key);
  // The scripts derive the channel from the lock's name the same way (lockKey .. ':w').
  return { lock: stem, fence: `${stem}:f`, queue: `${stem}:q`, deadlines: `${stem}:d`, channel: `${stem}:w` };
}

export interface LockNames {
  lock: string;
  fence: string;
  queue: string;
  deadlines: string;
  channel: string;
}

/**
 * The owner as the scripts compare it: spelled injectively, because ioredis sends strings as UTF-8, which turns every
 * lone surrogate into the same U+FFFD and so would let distinct owners re-enter each other's locks.
 */
export function ownerName(owner: string): string {
  return encodeKey(owner);
}

/**
 * Parses the ACQUIRE script's reply. Numbers are read with Number(): a client made with ioredis's `stringNumbers`
 * answers them as strings.
 */
export function parseAttempt(reply: unknown): AttemptResult {
  if (!Array.isArray(reply)) throw unexpectedReply(reply);
  const r = reply as [number | string, string | number, unknown?, number?];
  if (Number(r[0]) === 1) return { ok: true, token: String(r[1]), fence: Number(r[2]), ttl: Number(r[3]) };
  if (Array.isArray(r[2])) return { ok: false, pttl: Number(r[1]), ahead: r[2].map(String) };
  return r[2] === undefined ? { ok: false, pttl: Number(r[1]) } : { ok: false, pttl: Number(r[1]), holder: String(r[2]) };
}

/**
 * Adds `token` to `set` for `ms`. Outside any method on purpose: a timer made inside waitHere's closure would keep that
 * closure's whole scope (the waiter, its `granted` callback, and through it the attempt loop's every closure) alive.
 */
function forgetLater(set: Set<string>, token: string, ms: number): void {
  set.add(token);
  setTimeout(() => set.delete(token), ms).unref();
}

/** An acquire to give back (its token, or with an owner its hold) until `until` (store clock): see releaseUnsure. */
interface Unsure {
  key: string;
  n: LockNames;
  until: number;
  hold: string;
}

/** Tokens of this process's waiters that left a line lately, remembered per locker (see RedisLockStore.left). */
const LEFT_MAX = 1_024;
// A chain of hand-overs within the process that Redis has not recorded is covered this far back (see handOver): a
// longer one goes through Redis.
const COVER_MAX = 16;

/** How many tokens a cover names. */
function coverLength(cover: string): number {
  return cover === '' ? 0 : cover.split(' ').length;
}

/** A waiter of this process, in its key's line. */
interface LocalWaiter {
  readonly token: string;
  readonly owner: string;
  readonly ttl: number;
  readonly granted: (grant: Grant, since: number) => void;
  /**
   * The tokens ahead of it in the key's line in Redis, as its last refusal reported them, less those of this process's
   * waiters that have left the line since; null when not known (too many were ahead). Empty: it is first in line.
   */
  ahead: Set<string> | null;
}

export class RedisLockStore implements LockStore {
  private readonly wakeups: WakeupShare;
  // Waiters of this process by key, in the order they registered; a release offers the lock to the first.
  private readonly local = new Map<string, LocalWaiter[]>();
  // Tokens whose waiter gave up while a release naming it may still be on its way.
  private readonly gaveUp = new Set<string>();
  // Tokens of this process's waiters that left their line (let in, or gave up), oldest first: a refusal computed in
  // Redis before their leaving landed there may still list them as ahead. Kept far longer than a round trip.
  private readonly left = new Set<string>();
  // Tokens a release of this process named as its heir, oldest first (see releaseUnsure), while the lock may be theirs:
  // until every release that named one has answered that it went to someone else.
  private readonly named = new Set<string>();
  // How many releases that named each of those are still to answer.
  private readonly naming = new Map<string, number>();
  // Give-backs of named tokens' acquires put off while the lock may be theirs (see notHandedTo).
  private readonly heldBack = new Map<string, Unsure>();
  // Tokens of acquires that failed after they were sent, with their names and until when to release them.
  private readonly unsure = new Map<string, Unsure>();
  private unsureTimer: NodeJS.Timeout | undefined;
  private unsureDelay = 0;
  // What the first refusal of a waiter reported as ahead of it, until the waiter registers with waitHere.
  private readonly firstAhead = new Map<string, Set<string> | null>();
  // Hand-overs need commands to run in the order they are sent: a standalone connection gives that, a Cluster client
  // (redirections) does not.
  private readonly ordered: boolean;
  // Whether a lease of the locker holds the lock under a token now (see LockStore.watchLeases).
  private isLive: (token: string) => boolean = () => false;

  constructor(
    private readonly client: RedisClient,
    private readonly prefix: string,
    private readonly timeout: number,
    private readonly driftFactor: number,
  ) {
    this.wakeups = WakeupShare.of(client, timeout);
    this.ordered = (client as { isCluster?: boolean }).isCluster !== true;
  }

  attempt(key: string, token: string, owner: string, ttl: number, queue: boolean): Promise<AttemptResult> {
    const n = lockNames(this.prefix, key);
    const hold = holdId(token, owner);
    return this.call(
      'acquire',
      key,
      () =>
        ACQUIRE.run(
          this.client,
          [n.lock, n.fence, n.queue, n.deadlines],
          [token, ttl, ownerName(owner), '', queue ? '1' : '0'],
        ),
      // An acquire that lands after we gave up would hold the key until its ttl: hand it back. A same-owner grant
      // answers with the holder's token and added a hold to it, which its id names: releasing it drops just that hold.
      (late) => {
        const r = parseAttempt(late);
        if (!r.ok) {
          // A waiter's attempt refused after its call gave up (ioredis sent it again after a reconnect, when the
          // call's LEAVE could not go out) put the waiter back in the line, where it would hold up the next one until
          // its place lapses (1.5 to 3 s): it leaves the line, and only the line (a release here may have handed its
          // lease the lock under this token since, which a whole LEAVE would let go).
          if (queue) this.call('leave', key, () => LEAVE.run(this.client, [n.lock, n.queue, n.deadlines], [token, LINE_ONLY])).catch(() => undefined);
          return;
        }
        // A lease of this locker holds the lock under this token now (a hand-over here): the grant is that lease's.
        if (this.isLive(token)) return;
        // Not a grant under our own token while a release here may have handed it the lock: that lease's now, or, if
        // the release answers that it went elsewhere, given back then.
        if (r.token === token && this.named.has(token)) this.holdBack(token, { key, n, until: this.now() + ttl, hold });
        else this.releaseScript(n, r.token, undefined, hold).catch(() => undefined);
      },
      queue || hold !== ''
        ? (reply) => {
            const r = parseAttempt(reply);
            if (!r.ok) {
              this.noteAhead(key, token, r.ahead);
              return r;
            }
            if (r.token !== token) return { ...r, nested: true, hold };
            return hold === '' ? r : { ...r, hold };
          }
        : parseAttempt,
      () => this.releaseUnsure(token, { key, n, until: this.now() + ttl, hold }),
    );
  }

  /**
   * An acquire failed after it was sent (ioredis's `commandTimeout` or retry limit, a connection that closed with the
   * reply on its way): it may have taken the lock, or take it when a stalled Redis resumes, and no reply will come to
   * hand it back, so the key would be held by nobody for the whole ttl. Release its token: sent now, the release runs
   * after the acquire on this connection; it is sent again, backing off, until it gets through or the ttl is up. Not
   * when a release of this process named the token as its heir: the lock may be that waiter's lease by now (a waiter
   * that gave up is freed by handedTo). (A same-owner acquire that re-entered added a hold to the holder's token: its
   * id, `hold`, names it, whatever the token.)
   */
  private releaseUnsure(token: string, u: Unsure): void {
    if (this.isLive(token)) return;
    if (this.named.has(token)) {
      this.holdBack(token, u);
      return;
    }
    makeRoom(this.unsure, LEFT_MAX);
    this.unsure.set(token, u);
    this.sendUnsure(token);
  }

  /** Puts off the give-back of `token`'s acquire until the releases that named it heir have answered. */
  private holdBack(token: string, u: Unsure): void {
    makeRoom(this.heldBack, LEFT_MAX);
    this.heldBack.set(token, u);
  }

  private sendUnsure(token: string): void {
    const u = this.unsure.get(token);
    if (u === undefined) return;
    // Named as a release's heir since (a hand-over that landed after the acquire failed): the lock may be its lease's.
    if (this.isLive(token)) {
      this.unsure.delete(token);
      return;
    }
    if (this.now() >= u.until || this.named.has(token)) {
      this.unsure.delete(token);
      if (this.now() < u.until) this.holdBack(token, u);
      return;
    }
    this.call('release', u.key, () => this.releaseScript(u.n, token, undefined, u.hold)).then(
      () => {
        this.unsure.delete(token);
        this.unsureDelay = 0;
      },
      () => {
        if (this.unsureTimer !== undefined) return;
        this.unsureDelay = backoff(this.unsureDelay, RESEND_FIRST_MS, RESEND_MAX_MS);
        this.unsureTimer = setTimeout(() => {
          this.unsureTimer = undefined;
          for (const t of [...this.unsure.keys()]) this.sendUnsure(t);
        }, this.unsureDelay);
        this.unsureTimer.unref();
      },
    );
  }

  watchLeases(isLive: (token: string) => boolean): void {
    this.isLive = isLive;
  }

  async leave(key: string, token: string): Promise<void> {
    const n = lockNames(this.prefix, key);
    await this.call('leave', key, () => LEAVE.run(this.client, [n.lock, n.queue, n.deadlines], [token]));
  }

  async extend(key: string, token: string, ttl: number, held?: Held): Promise<number | null> {
    const n = lockNames(this.prefix, key);
    const args = extendArgs(token, ttl, held?.hold, held?.cover);
    const left = Number(await this.call('extend', key, () => EXTEND.run(this.client, [n.lock], args)));
    return left < 0 ? null : left;
  }

  release(key: string, token: string, from?: Releasing, _shared?: boolean, hold = '', _until?: number, cover = ''): Promise<boolean> {
    const n = lockNames(this.prefix, key);
    const heir = this.local.get(key)?.[0];
    // A chain already as long as a cover can name (see handOver) goes through Redis instead.
    if (heir !== undefined && from !== undefined && heir.ahead?.size === 0 && this.ordered && coverLength(cover) < COVER_MAX) {
      const now = this.now();
      // The heir is covered by the releasing lease until that ends, and by its own once Redis has recorded it.
      const expiresAt = Math.min(from.expiresAt, now + heir.ttl - this.drift(heir.ttl));
      if (expiresAt - now >= heir.ttl / 2) return this.handOver(n, key, token, heir, from.fence + 1, now, expiresAt, cover);
    }
    // The reply is 0 (not held), 1 (released), or {1, fence} when the lock went straight to `heir`.
    let handOff: ((reply: unknown) => void) | undefined;
    if (heir !== undefined) {
      const since = this.now();
      handOff = (reply) => {
        if (Array.isArray(reply)) {
          const grant = { ok: true, token: heir.token, fence: Number(reply[1]), ttl: heir.ttl, hold: holdId(heir.token, heir.owner) } as const;
          this.handedTo(key, heir, grant, since);
        } else {
          this.notHandedTo(heir.token);
        }
      };
    }
    return this.call('release', key, () => this.releaseScript(n, token, heir, hold, cover), handOff, (reply) => {
      handOff?.(reply);
      return Array.isArray(reply) || Number(reply) !== 0;
    });
  }

  waitHere(key: string, token: string, owner: string, ttl: number, granted: LocalWaiter['granted']): (acquired: boolean) => void {
    const ahead = this.firstAhead.get(token) ?? null;
    this.firstAhead.delete(token);
    if (ahead !== null) for (const t of ahead) if (this.left.has(t)) ahead.delete(t);
    const waiter: LocalWaiter = { token, owner, ttl, granted, ahead };
    let line = this.local.get(key);
    if (line === undefined) {
      line = [];
      this.local.set(key, line);
    }
    line.push(waiter);
    return (acquired) => {
      if (!this.dropLocal(key, waiter) || acquired) return;
      // A release sent before this may still hand it the lock; handedTo frees it then. Forgotten once that is ruled out.
      forgetLater(this.gaveUp, token, this.timeout * 2);
    };
  }

  listen(key: string, wake: (next: string) => void): Promise<() => void> {
    return this.wakeups.listen(lockNames(this.prefix, key).channel, wake);
  }

  drift(ttl: number): number {
    return driftFor(ttl, this.driftFactor);
  }

  now(): number {
    return monotonicNow();
  }

  close(): void {
    this.wakeups.close();
  }

  flush(): void {
    sendNow(this.client);
  }

  /** A release handed the lock to `heir`: give it the lease, or, if it gave up meanwhile, free the lock again. */
  private handedTo(key: string, heir: LocalWaiter, grant: Grant, since: number): void {
    if (this.dropLocal(key, heir)) {
      heir.granted(grant, since);
    } else if (this.gaveUp.delete(heir.token)) {
      this.release(key, heir.token, undefined, false, grant.hold).catch(() => undefined);
    }
  }

  private dropLocal(key: string, waiter: LocalWaiter): boolean {
    const line = this.local.get(key);
    const i = line === undefined ? -1 : line.indexOf(waiter);
    if (i < 0) return false;
    line!.splice(i, 1);
    if (line!.length === 0) this.local.delete(key);
    // Out of the line: those behind it here stop counting it as ahead of them.
    makeRoom(this.left, LEFT_MAX);
    this.left.add(waiter.token);
    for (const w of line!) w.ahead?.delete(waiter.token);
    return true;
  }

  private noteHeir(heir: string): void {
    makeRoom(this.named, LEFT_MAX);
    this.named.add(heir);
    makeRoom(this.naming, LEFT_MAX);
    this.naming.set(heir, (this.naming.get(heir) ?? 0) + 1);
  }

  /**
   * A release that named `heir` answered that the lock went elsewhere (first in Redis's line was another process's
   * waiter): once no other such release is still to answer, the heir's own late or unsure acquires are given back as
   * anyone's (kept, they would hold the key for their ttl).
   */
  private notHandedTo(heir: string): void {
    const left = (this.naming.get(heir) ?? 1) - 1;
    if (left > 0) {
      this.naming.set(heir, left);
      return;
    }
    this.naming.delete(heir);
    this.named.delete(heir);
    const u = this.heldBack.get(heir);
    if (u === undefined) return;
    this.heldBack.delete(heir);
    this.releaseUnsure(heir, u);
  }

  /** A queued attempt of `token` was refused; `ahead`: the tokens ahead of it in the line, if the reply listed them. */
  private noteAhead(key: string, token: string, ahead: readonly string[] | undefined): void {
    // Let in meanwhile (this refusal was on its way): nothing to note.
    if (this.left.has(token)) return;
    let set: Set<string> | null = null;
    if (ahead !== undefined) {
      set = new Set();
      for (const t of ahead) if (!this.left.has(t)) set.add(t);
    }
    const waiter = this.local.get(key)?.find((w) => w.token === token);
    if (waiter !== undefined) {
      waiter.ahead = set;
      return;
    }
    // Its first refusal: waitHere follows at once. Bounded in case it does not (the waiter gave up meanwhile).
    makeRoom(this.firstAhead, LEFT_MAX);
    this.firstAhead.set(token, set);
  }

  /**
   * Lets `heir`, first in the key's line, in at once with `fence`, then records the hand-over in Redis (TRANSFER). Until
   * its reply the heir's lease runs on the releasing one (`expiresAt`): the lock stays under the releasing token there,
   * so nobody else can take it. Resolves whether the releasing token held the lock.
   */
  private handOver(n: LockNames, key: string, token: string, heir: LocalWaiter, fence: number, since: number, expiresAt: number, cover: string): Promise<boolean> {
    let settle!: (expiresAt: number | null) => void;
    const confirmation = new Promise<number | null>((resolve) => (settle = resolve));
    this.dropLocal(key, heir);
    this.noteHeir(heir.token);
    // Until Redis runs the TRANSFER below, the lock is under the releasing token there (or, when that lease was let in
    // the same way and its own TRANSFER has not run either, under that one's cover): the heir's commands sent meanwhile,
    // which Redis runs after the TRANSFER, name it too. Refused (READONLY, MISCONF, ...), the TRANSFER never runs, and the
    // heir holds there for good. (Sent again, it could land after the heir's own release and hold the key for nobody.)
    const heirCover = cover === '' ? token : `${token} ${cover}`;
    heir.granted({ ok: true, token: heir.token, fence, ttl: heir.ttl, expiresAt, confirmation, hold: holdId(heir.token, heir.owner), cover: heirCover }, since);
    const recorded = (reply: unknown): boolean => {
      const r = Number(reply);
      settle(r === 1 ? since + heir.ttl - this.drift(heir.ttl) : null);
      return r !== 0;
    };
    const args = [token, heir.token, fence, heir.ttl, ownerName(heir.owner)];
    if (cover !== '') args.push(cover);
    return this.call('release', key, () => TRANSFER.run(this.client, [n.lock, n.queue, n.deadlines, n.fence], args), recorded, recorded).catch(() => {
      // Not recorded (yet): the heir keeps the releasing lease's time, and a late reply still settles it. For the
      // releasing holder the lock has passed on either way.
      return true;
    });
  }

  /** Drops one hold of `token`; at zero, hands the lock to `heir` if it is first in line. */
  private releaseScript(n: LockNames, token: string, heir?: LocalWaiter, hold = '', cover = ''): Promise<unknown> {
    const args = releaseArgs(token, hold, '', '', cover);
    if (heir === undefined) return RELEASE.run(this.client, [n.lock, n.queue, n.deadlines], args);
    this.noteHeir(heir.token);
    // The heir's three in their places after the token, and the rest as without one.
    return RELEASE.run(this.client, [n.lock, n.queue, n.deadlines, n.fence], [token, heir.token, heir.ttl, ownerName(heir.owner), ...args.slice(4)]);
  }

  // One promise, not an async function or a chain: this runs twice per lock cycle, and every await costs a tick.
  private call<T, R = T>(
    what: string,
    key: string,
    op: () => Promise<T>,
    late?: (result: T) => void,
    map?: (result: T) => R,
    unsure?: () => void,
  ): Promise<R> {
    return bounded(
      this.client,
      this.timeout,
      op,
      late,
      map,
      (error) => lockFailed(what, key, (error as Error).message, error),
      unsure,
    );
  }
}
