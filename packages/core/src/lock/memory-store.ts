// LockStore in this process's memory: the embedded default, and the reference the Redis backends are tested against.
import { QUEUE_HEARTBEAT_MS } from './redis-store.js';
import { holdId, MAX_POLL_MS } from './scripts.lua.js';
import type { AttemptResult, Held as Lease, LockStore } from './store.js';

interface Held {
  token: string;
  owner: string;
  /** With an owner, its holds as on Redis: hold id → deadline; each ends on its own, the lock with the latest. */
  holds: Map<string, number> | undefined;
  fence: number;
  expiresAt: number;
}

export class MemoryLockStore implements LockStore {
  private readonly locks = new Map<string, Held>();
  private readonly listeners = new Map<string, Set<(next: string) => void>>();
  // Waiting lines, as in the Redis backend: token → heartbeat deadline, in arrival order.
  private readonly queues = new Map<string, Map<string, number>>();
  // One counter for every key: strictly increasing per key, and no per-key state to keep after release.
  private lastFence = 0;
  // Walks the map a little on every attempt so expired, never-released locks do not pile up.
  private sweeper: Iterator<[string, Held]> | undefined;

  constructor(
    private readonly clock: () => number,
    private readonly checkClock?: () => Error | undefined,
  ) {}

  clockError(): Error | undefined {
    return this.checkClock?.();
  }

  attempt(key: string, token: string, owner: string, ttl: number, queue: boolean): Promise<AttemptResult> {
    this.sweep();
    const now = this.clock();
    const cur = this.live(key, now);
    if (cur) {
      if ((owner !== '' && cur.owner === owner) || cur.token === token) {
        if (cur.holds === undefined) {
          cur.expiresAt = Math.max(cur.expiresAt, now + ttl);
          return Promise.resolve({ ok: true, token: cur.token, fence: cur.fence, ttl: cur.expiresAt - now });
        }
        const hold = holdId(token, owner);
        cur.holds.set(hold, now + ttl);
        cur.expiresAt = latest(cur.holds, now);
        const grant = { ok: true, token: cur.token, fence: cur.fence, ttl, hold } as const;
        return Promise.resolve(cur.token === token ? grant : { ...grant, nested: true });
      }
      if (queue) this.join(key, token, now);
      return Promise.resolve({ ok: false, pttl: cur.expiresAt - now });
    }
    const head = this.firstLive(key, now);
    if (head !== undefined && head !== token) {
      if (queue) this.join(key, token, now);
      return Promise.resolve({ ok: false, pttl: -1 });
    }
    if (head !== undefined) this.dequeue(key, token);
    const fence = ++this.lastFence;
    const hold = holdId(token, owner);
    if (hold === '') {
      this.locks.set(key, { token, owner, holds: undefined, fence, expiresAt: now + ttl });
      return Promise.resolve({ ok: true, token, fence, ttl });
    }
    this.locks.set(key, { token, owner, holds: new Map([[hold, now + ttl]]), fence, expiresAt: now + ttl });
    return Promise.resolve({ ok: true, token, fence, ttl, hold });
  }

  extend(key: string, token: string, ttl: number, held?: Lease): Promise<number | null> {
    const now = this.clock();
    const cur = this.live(key, now);
    if (!cur || cur.token !== token) return Promise.resolve(null);
    if (cur.holds === undefined) {
      cur.expiresAt = Math.max(cur.expiresAt, now + ttl);
      return Promise.resolve(cur.expiresAt - now);
    }
    const hold = held?.hold ?? '';
    const own = cur.holds.get(hold);
    if (own === undefined || own <= now) return Promise.resolve(null);
    const deadline = Math.max(own, now + ttl);
    cur.holds.set(hold, deadline);
    cur.expiresAt = latest(cur.holds, now);
    return Promise.resolve(deadline - now);
  }

  release(key: string, token: string, _from?: unknown, _shared?: boolean, hold = ''): Promise<boolean> {
    const now = this.clock();
    const cur = this.live(key, now);
    if (!cur || cur.token !== token) return Promise.resolve(false);
    if (cur.holds !== undefined) {
      // A hold that has ended is not released: its lease is over, as on Redis (others of the lock may hold on).
      const own = cur.holds.get(hold);
      if (own === undefined || own <= now) return Promise.resolve(false);
      cur.holds.delete(hold);
      const until = latest(cur.holds, now);
      if (until > now) {
        // Ours was the latest: the lock now ends sooner, which a waiter asleep until its old end must hear, when that is
        // before its next attempt anyway (see RELEASE).
        const shorter = until < cur.expiresAt && until - now < MAX_POLL_MS;
        cur.expiresAt = until;
        const head = shorter ? this.firstLive(key, now) : undefined;
        if (head !== undefined) this.wake(key, head);
        return Promise.resolve(true);
      }
    }
    this.locks.delete(key);
    this.wake(key, this.firstLive(key, now) ?? '');
    return Promise.resolve(true);
  }

  leave(key: string, token: string): Promise<void> {
    if (this.dequeue(key, token) && !this.live(key, this.clock())) {
      const head = this.firstLive(key, this.clock());
      if (head !== undefined) this.wake(key, head);
    }
    return Promise.resolve();
  }

  listen(key: string, wake: (next: string) => void): Promise<() => void> {
    let set = this.listeners.get(key);
    if (!set) {
      set = new Set();
      this.listeners.set(key, set);
    }
    set.add(wake);
    return Promise.resolve(() => {
      const s = this.listeners.get(key);
      if (s?.delete(wake) && s.size === 0) this.listeners.delete(key);
    });
  }

  drift(): number {
    return 0; // one clock, no network
  }

  now(): number {
    return this.clock();
  }

  close(): void {
    this.listeners.clear();
    this.queues.clear();
  }

  /** Number of locks currently stored (for tests of bounded memory). */
  get size(): number {
    return this.locks.size;
  }

  private wake(key: string, next: string): void {
    const set = this.listeners.get(key);
    if (set) for (const wake of [...set]) wake(next);
  }

  private join(key: string, token: string, now: number): void {
    let q = this.queues.get(key);
    if (!q) {
      q = new Map();
      this.queues.set(key, q);
    }
    q.set(token, now + QUEUE_HEARTBEAT_MS);
  }

  private dequeue(key: string, token: string): boolean {
    const q = this.queues.get(key);
    if (!q?.delete(token)) return false;
    if (q.size === 0) this.queues.delete(key);
    return true;
  }

  private firstLive(key: string, now: number): string | undefined {
    const q = this.queues.get(key);
    if (!q) return undefined;
    for (const [token, deadline] of q) {
      if (deadline > now) return token;
      q.delete(token);
    }
    this.queues.delete(key);
    return undefined;
  }

  private live(key: string, now: number): Held | undefined {
    const cur = this.locks.get(key);
    if (cur && cur.expiresAt <= now) {
      this.locks.delete(key);
      return undefined;
    }
    return cur;
  }

  private sweep(): void {
    const now = this.clock();
    for (let i = 0; i < 2; i++) {
      this.sweeper ??= this.locks.entries();
      const next = this.sweeper.next();
      if (next.done) {
        this.sweeper = undefined;
        return;
      }
      const [key, held] = next.value;
      if (held.expiresAt <= now) this.locks.delete(key);
    }
  }
}

/** Drops the holds that have ended by `now`; the latest deadline of the others (0 when none is left). */
function latest(holds: Map<string, number>, now: number): number {
  let last = 0;
  for (const [id, deadline] of holds) {
    if (deadline <= now) holds.delete(id);
    else if (deadline > last) last = deadline;
  }
  return last;
}
