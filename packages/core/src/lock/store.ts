// The small storage interface each lock backend implements; leases, waiting, reentrancy and extension live once, above it.

/** Result of one acquisition attempt. */
export type AttemptResult =
  | {
      readonly ok: true;
      /** The lock's token: ours, or the existing one when the same owner re-entered. */
      readonly token: string;
      readonly fence: number;
      /** Ms the lock is held for, counted from when the attempt was sent, before drift is taken off. */
      readonly ttl: number;
      /**
       * A lock let in by a release in this process before the store recorded it (see `Releasing`): when its lease ends
       * (store clock) until the store confirms; this replaces the time `ttl` gives.
       */
      readonly expiresAt?: number;
      /** Settles once the store has recorded such a hand-over: the lease's new end, or null when it did not take. */
      readonly confirmation?: Promise<number | null>;
      /**
       * True when the same owner re-entered a lock already held: `token` is the holder's, and the attempt's own token
       * (its place in line) was not used. Set at least for an attempt that queued, the one case the locker acts on
       * (RedisLock leaves it unset otherwise, to spare its uncontended path a closure per call).
       */
      readonly nested?: boolean;
      /**
       * The id of the hold this grant added to a lock with an owner (see HOLD_ID_LENGTH in scripts.lua.ts), which its
       * release names; '' or absent for a lock without an owner.
       */
      readonly hold?: string;
      /**
       * A lock let in by a hand-over within this process (see `Releasing`): the tokens, space-separated, Redis may still
       * hold the lock under for this lease, the releasing lease's first, until it records the hand-over (and for good if
       * it refused to). The lease's extensions and release name them.
       */
      readonly cover?: string;
    }
  | {
      readonly ok: false;
      /** Holder's remaining ms when known, else -1. */
      readonly pttl: number;
      /** A queued attempt: the tokens ahead of it in the key's line, when the store says (empty: it is first). */
      readonly ahead?: readonly string[];
      /**
       * Otherwise, who refused it: the holder's token, or the first waiter's name when the line did. Redlock counts a
       * round's refusals per holder: only refusals that could be one holder's quorum make the key busy.
       */
      readonly holder?: string;
    };

/**
 * The lease being released, for a store that may let a waiter of this process in at once: possible only while the lease
 * still holds (so the lock cannot be taken elsewhere before the store records the hand-over) and cannot be nested.
 */
export interface Releasing {
  /** Its fence: the waiter let in gets the next one. */
  readonly fence: number;
  /** When it ends (store clock, drift taken off). */
  readonly expiresAt: number;
}

/** The lease being extended. */
export interface Held {
  readonly fence: number;
  /** Its reentrancy owner, '' for none. */
  readonly owner: string;
  /** When it ends (store clock), as it stands now. */
  readonly expiresAt: number;
  /** Its hold's id (Grant.hold), '' for none. */
  readonly hold: string;
  /** Its cover (Grant.cover), '' for none. */
  readonly cover?: string;
  /** Whether it has ended (released or lost) by now: its lock is not to be put back then. */
  readonly over?: boolean;
}

/** A successful attempt. */
export type Grant = Extract<AttemptResult, { ok: true }>;

/** What a backend must do. Every method rejects with a {@link LockUnavailableError} when the store cannot answer. */
export interface LockStore {
  /**
   * One attempt to take `key` for `ttl` ms with the fresh `token`, or to re-enter it as `owner` (empty: no owner).
   * With `queue`, a refused caller joins the key's waiting line (backends that keep one), so locks are handed over
   * in arrival order instead of to whoever asks first after a release.
   */
  attempt(key: string, token: string, owner: string, ttl: number, queue: boolean): Promise<AttemptResult>;
  /** A queued waiter gives up: leave the line (best effort). */
  leave(key: string, token: string): Promise<void>;
  /**
   * Makes the lock live at least `ttl` more ms if `token` still holds it; the new remaining ms, or null when not held.
   * `held` describes the lease, for a store that can put its lock back where it went missing (Redlock).
   */
  extend(key: string, token: string, ttl: number, held?: Held): Promise<number | null>;
  /**
   * Drops one hold of `token` (the lock is freed at zero holds); whether `token` held the lock. `from` is given when the
   * lease has not ended and has no owner (so it is the lock's only hold). `shared` is true when other leases of this
   * store's locker still hold under `token` (nested leases of one owner): the lock stays theirs. `hold` names the hold
   * to drop of a lock with an owner (Grant.hold): so a release that runs twice drops it only once. `until` (store clock):
   * how long the lock may stay where the release failed, for a store that sends it there again meanwhile (Redlock,
   * whose release is decided by a quorum without the failed nodes). `cover`: Grant.cover.
   */
  release(key: string, token: string, from?: Releasing, shared?: boolean, hold?: string, until?: number, cover?: string): Promise<boolean>;
  /**
   * Calls `wake` when `key` may have been freed, with the token of the waiter it was handed to ('' when anyone may try). Resolves once listening is active; rejects if it cannot be set up,
   * in which case the waiter polls.
   */
  listen(key: string, wake: (next: string) => void): Promise<() => void>;
  /**
   * Optional: a waiter of this process that is in the key's line says so, so that a release by this process can hand
   * the lock straight to it when it is first in line, instead of waking it to ask again (a round trip saved per
   * hand-off). `granted` receives the grant and the store-clock time before which it was made. The returned function
   * ends the registration: `acquired` true when the waiter holds the lock under its token by now (a grant arriving
   * later is the same lock), false when it gives up (a grant arriving later is freed).
   */
  waitHere?(key: string, token: string, owner: string, ttl: number, granted: (grant: Grant, since: number) => void): (acquired: boolean) => void;
  /** Longest sleep of a waiter between two attempts, ms, when it is not woken (default 1 s): its place in line lapses without them. */
  readonly pollMs?: number;
  /** Ms to take off a lease of `ttl` ms for clock drift and rate differences. */
  drift(ttl: number): number;
  /** The clock leases are measured with (epoch ms). */
  now(): number;
  /** Why no call may start now, for a store on an injected clock that gives no time (see validate.clock). */
  clockError?(): Error | undefined;
  /** Frees connections and timers. */
  close(): void;
  /**
   * Optional: how the store learns whether a lease of its locker holds the lock under `token` now. A store that gives
   * back what a failed or late acquire took must never give back a live lease's lock (its record of the tokens its
   * releases handed the lock to is bounded).
   */
  watchLeases?(isLive: (token: string) => boolean): void;
  /**
   * Optional: sends the calls made so far now, instead of merged with later ones at the end of the callback or turn
   * (see script.ts), so that they reach Redis before what the process writes next elsewhere.
   */
  flush?(): void;
}
