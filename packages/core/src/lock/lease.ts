// The one Lease implementation every backend hands out: expiry tracking, extension, idempotent release, and the
// abort signal that tells the holder its lock is gone.
import { asLockError, HaspError, LockLostError, LockUnavailableError } from '../errors.js';
import type { Lease, LockErrorEvent } from '../types.js';
import { backoff, RESEND_FIRST_MS, RESEND_MAX_MS } from '../util/bounded.js';
import * as v from '../util/validate.js';
import type { LockStore } from './store.js';

/** Why a lease's signal aborted when it was released normally. */
export class LeaseReleasedError extends Error {
  constructor(key: string) {
    super(`lease on "${key.length > 64 ? `${key.slice(0, 61)}...` : key}" was released`);
    this.name = 'AbortError';
  }
}

/** A lease's link to the other leases of its locker under the same token. */
export interface LeaseTies {
  /** This lease has ended (released or lost): called once. */
  ended(): void;
  /** Whether another lease of the locker under this token has not ended. */
  shared(): boolean;
}

export class LeaseImpl implements Lease {
  // The AbortController is made on first access of `signal` (most leases are released without anyone looking at it):
  // until then `ended` and `endReason` stand for its state, and the getter hands out a signal already aborted with the
  // same reason when the lease ended before.
  private controller: AbortController | undefined;
  private ended = false;
  private endReason: (() => unknown) | undefined;
  private expiry: number;
  private expiryTimer: NodeJS.Timeout | undefined;
  private extendTimer: NodeJS.Timeout | undefined;
  /** The last auto-extension's failure, while the extensions fail (none has got through since). */
  private extendFailure: HaspError | undefined;
  private releasing: Promise<boolean> | undefined;
  private released = false;
  private retryTimer: NodeJS.Timeout | undefined;
  private retryDelay = 0;
  // Until when (store clock) the store holds the lock for this lease after a hand-over confirmed once it had ended: a
  // release that could not be sent is worth sending again until then, though the lease itself ran out before.
  private confirmedUntil = 0;
  // The latest the store may hold the lock for this lease by what it answered (store clock): its ttl ran from when it
  // granted or extended, before the reply came. (The expiry counts from before the request went out: the other bound.)
  private storeEnd: number;

  constructor(
    private readonly store: LockStore,
    readonly key: string,
    readonly token: string,
    readonly fence: number,
    expiresAt: number,
    private readonly ttl: number,
    private readonly report: (event: LockErrorEvent) => void,
    /** Its reentrancy owner; '' (none) makes it its lock's only hold, so a release frees the lock (or lets a waiter in). */
    readonly owner: string,
    /** How the leases of one locker that share a token (nested leases) keep count of each other. */
    private readonly ties?: LeaseTies,
    /** The id of its hold of a lock with an owner (Grant.hold), which its release names; '' for none. */
    readonly hold = '',
    /**
     * The tokens Redis may still hold its lock under (Grant.cover), which its extensions and release name; '' for none,
     * and once Redis recorded the hand-over (see confirm).
     */
    public cover = '',
  ) {
    this.expiry = expiresAt;
    this.storeEnd = store.now() + ttl;
    this.armExpiry();
  }

  get signal(): AbortSignal {
    // After a stall of the event loop (a long synchronous step, a debugger, a GC pause) the expiry timer has not run
    // yet: the holder reading the signal right after must still learn that the lease is over.
    this.checkExpiry();
    if (this.controller === undefined) {
      this.controller = new AbortController();
      if (this.ended) this.controller.abort(this.endReason?.());
    }
    return this.controller.signal;
  }

  get expiresAt(): number {
    return this.expiry;
  }

  /** Released or lost (see Held.over). */
  get over(): boolean {
    return this.ended;
  }

  /** Ended without its holder releasing it (by its clock, or the store said so). */
  get lost(): boolean {
    return this.ended && this.releasing === undefined && !this.released;
  }

  /**
   * For how much longer (ms) the store may still hold this lease's key, by what it answered: past that, a release
   * frees nothing the ttl has not freed. (An extension that timed out may still land and hold it longer.)
   */
  storeMayHoldFor(): number {
    // Let in by a hand-over Redis has not recorded yet: it holds the lock under the releasing lease's token, for as long
    // as that lease's ttl says, which this one does not know.
    if (this.cover !== '') return Infinity;
    return Math.max(0, Math.max(this.expiry + this.store.drift(this.ttl), this.storeEnd) - this.store.now());
  }

  async extend(ttl: number = this.ttl): Promise<void> {
    v.duration('ttl', ttl);
    // Past its end by our clock the lease is over, whatever Redis still holds: its holder may have been told so.
    this.checkExpiry();
    if (this.released || this.ended) throw new LockLostError(this.key);
    await this.doExtend(ttl);
  }

  release(): Promise<boolean> {
    if (this.released) return Promise.resolve(false);
    // Only the call that released it answers true (SPEC): a second one made meanwhile answers after it, false (or the
    // same error, when the first failed).
    if (this.releasing) {
      const again = this.releasing.then(() => false);
      // Like the first call's promise, one left unawaited must not be an unhandled rejection when the release fails.
      again.catch(() => undefined);
      return again;
    }
    this.stopTimers();
    // Only a lease that still holds may let a waiter in before the store has recorded it (see LockStore.release).
    const live = !this.ended && this.owner === '';
    if (!this.ended) this.end(() => new LeaseReleasedError(this.key));
    const p = (async () => {
      // Sent at once, not after an extension still on its way: that would add the extension's timeout to the
      // release's on a frozen Redis. The stores send both on the same connections, so Redis runs the extension first;
      // its reply, arriving after this lease ended, changes nothing (doExtend), and a lock it put back on a Redlock
      // node is taken off again (RedlockStore.restore).
      const from = live && this.store.now() < this.expiry ? { fence: this.fence, expiresAt: this.expiry } : undefined;
      const held = await this.store.release(this.key, this.token, from, this.ties?.shared() ?? false, this.hold, this.heldUntil(), this.cover);
      this.released = true;
      return held;
    })();
    this.releasing = p;
    p.then(
      () => this.stopRetrying(),
      (error: unknown) => {
        // A failed release may be retried by calling release() again; hasp also does so itself, see retryRelease.
        if (this.releasing !== p) return;
        this.releasing = undefined;
        if (error instanceof LockUnavailableError) this.retryRelease();
      },
    );
    return p;
  }

  /**
   * {@link release}, sent to the store now rather than merged with the calls made later in this callback: for a release
   * that must reach Redis before what the caller writes next elsewhere (withLock's, before the response).
   */
  releaseNow(): Promise<boolean> {
    const released = this.release();
    this.store.flush?.();
    return released;
  }

  /**
   * Sends a release that could not reach the store again, 100 ms later and then backing off to once a second, until it
   * gets through or the lease would have run out anyway. Its holder is done: left to its ttl, a network blip at the
   * moment of release would keep the key refused to everyone for up to the whole ttl (30 s by default), though Redis
   * was back within a second. Sending it again is harmless: without an owner the token is this lease's alone and the
   * release compares it; with one, the release names this lease's own hold (`hold`) among those of the token it shares
   * with nested leases or another process's under the same owner. Either way a first one that reached Redis after all
   * makes the next a no-op.
   */
  private retryRelease(): void {
    if (this.retryTimer !== undefined) return;
    const left = this.heldUntil() - this.store.now();
    if (left <= 0) return;
    this.retryDelay = backoff(this.retryDelay, RESEND_FIRST_MS, RESEND_MAX_MS);
    this.retryTimer = setTimeout(() => {
      this.retryTimer = undefined;
      if (this.store.now() < this.heldUntil()) this.release().catch(() => undefined);
    }, Math.min(this.retryDelay, left));
    this.retryTimer.unref();
  }

  /** Until when the store may hold the lock under this lease's token (store clock). */
  private heldUntil(): number {
    return Math.max(this.expiry, this.confirmedUntil);
  }

  private stopRetrying(): void {
    if (this.retryTimer !== undefined) clearTimeout(this.retryTimer);
    this.retryTimer = undefined;
  }

  /**
   * Keeps the lease alive until released: extends when half the remaining time has passed, retries failures
   * while time is left, and aborts the signal when the lock is lost for good.
   */
  startAutoExtend(): void {
    const schedule = (delay: number) => {
      if (this.ended) return;
      this.extendTimer = setTimeout(tick, Math.max(0, delay));
      this.extendTimer.unref();
    };
    const tick = () => {
      this.extendTimer = undefined;
      if (this.ended) return;
      this.extend().then(
        () => {
          this.extendFailure = undefined;
          schedule((this.expiry - this.store.now()) / 2);
        },
        (error: unknown) => {
          if (this.ended) return; // lost (already reported) or released meanwhile
          const err = asLockError('extend', this.key, error);
          // Retries come ever faster as the lease runs out (they fail at once while the client reconnects): only the
          // first failure of a run is reported, not one event per retry; the last one is the cause of the loss.
          if (this.extendFailure === undefined) this.report({ operation: 'extend', key: this.key, error: err });
          this.extendFailure = err;
          // Transient failure: try again soon, while the lease is still valid; the expiry timer aborts otherwise.
          const left = this.expiry - this.store.now();
          schedule(Math.min(Math.max(left / 4, 5), 1_000));
        },
      );
    };
    schedule((this.expiry - this.store.now()) / 2);
  }

  /** The store recorded the hand-over this lease began with: it now holds until `expiresAt` (see Grant.confirmation). */
  confirm(expiresAt: number): void {
    // Under its own token in Redis now, and whatever this lease sends next runs there after the hand-over: no cover is
    // needed, and none is passed on (a chain's covers would grow with every hand-over, recorded or not).
    this.cover = '';
    if (this.ended) {
      // Lost (its time ran out while Redis was slow to record the hand-over) and its holder told so: the lock Redis
      // has just put under its token serves nobody, so hand it back rather than leave the key held for its ttl (a
      // release of its own already on its way is that one; sent again if it fails, until then: retryRelease).
      if (expiresAt > this.confirmedUntil) this.confirmedUntil = expiresAt;
      this.release().catch(() => undefined);
      return;
    }
    // Redis recorded the hand-over, with this lease's ttl, before this reply.
    this.storeEnd = Math.max(this.storeEnd, this.store.now() + this.ttl);
    if (expiresAt <= this.expiry) return;
    this.expiry = expiresAt;
    this.armExpiry();
  }

  /** Marks the lease lost: aborts the signal with a LockLostError and reports it. */
  lose(error: LockLostError): void {
    if (this.ended) return;
    this.stopTimers();
    this.end(() => error);
    this.report({ operation: 'lost', key: this.key, error });
  }

  private async doExtend(ttl: number): Promise<void> {
    const started = this.store.now();
    const left = await this.store.extend(this.key, this.token, ttl, this);
    if (left === null) {
      const error = new LockLostError(this.key);
      this.lose(error);
      throw error;
    }
    // The store's ttl ran from when it got the extension, before this reply: by now it has less than `left` left. (Also
    // for a lease that ended meanwhile: the store holds the key that long unless the release frees it.)
    this.storeEnd = Math.max(this.storeEnd, this.store.now() + left);
    if (this.ended) {
      // A release meanwhile ended it: this extension counted, and the release (Redis runs it after) frees the lock.
      if (this.releasing !== undefined || this.released) return;
      // It reached its end while the extension was on its way, and its holder has been told it is lost: Redis's new
      // ttl serves nobody, so hand the lock back rather than leave the key held for it (and send it again while Redis
      // may hold it, should it fail: see retryRelease).
      if (this.storeEnd > this.confirmedUntil) this.confirmedUntil = this.storeEnd;
      this.release().catch(() => undefined);
      throw new LockLostError(this.key, `lease on "${this.key}" ended before its extension was confirmed`);
    }
    this.expiry = Math.max(this.expiry, started + left - this.store.drift(left));
    this.armExpiry();
  }

  /** Aborts the signal (now if it exists, else when it is first asked for) with the reason `reason` makes. */
  private end(reason: () => unknown): void {
    this.ties?.ended();
    this.ended = true;
    this.endReason = reason;
    this.controller?.abort(reason());
  }

  private armExpiry(): void {
    if (this.expiryTimer) clearTimeout(this.expiryTimer);
    const delay = this.expiry - this.store.now();
    this.expiryTimer = setTimeout(() => {
      this.expiryTimer = undefined;
      // Timers can fire early relative to the clock; only call it expired when the clock agrees.
      if (this.store.now() < this.expiry) return this.armExpiry();
      this.checkExpiry();
    }, Math.max(0, Math.min(delay, 2 ** 31 - 1)));
    this.expiryTimer.unref();
  }

  /** Marks the lease lost once the clock has passed its end (released and lost leases have ended already). */
  private checkExpiry(): void {
    if (this.ended || this.store.now() < this.expiry) return;
    const failure = this.extendFailure;
    if (failure === undefined) this.lose(new LockLostError(this.key, `lease on "${this.key}" expired`));
    else this.lose(new LockLostError(this.key, `lease on "${this.key}" expired: its extension failed (${failure.message})`, { cause: failure }));
  }

  private stopTimers(): void {
    if (this.expiryTimer) clearTimeout(this.expiryTimer);
    if (this.extendTimer) clearTimeout(this.extendTimer);
    this.expiryTimer = undefined;
    this.extendTimer = undefined;
  }
}
