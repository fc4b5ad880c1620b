// LockStore in this process's memory: the embedded default, and the reference the Redis backends are tested against.
import { QUEUE_HEARTBEAT_MS } from './redis-store.js';
import type { AttemptResult, LockStore } from './store.js';

interface Held {
  token: string;
  owner: string;
  holds: number;
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

  constructor(private readonly clock: () => number) {}

  attempt(key: string, token: string, owner: string, ttl: number, queue: boolean): Promise<AttemptResult> {
    this.sweep();
    const now = this.clock();
    const cur = this.live(key, now);
    if (cur) {
      if ((owner !== '' && cur.owner === owner) || cur.token === token) {
        if (cur.token !== token) cur.holds++;
        cur.expiresAt = Math.max(cur.expiresAt, now + ttl);
        const grant = { ok: true, token: cur.token, fence: cur.fence, ttl: cur.expiresAt - now } as const;
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
    this.locks.set(key, { token, owner, holds: 1, fence, expiresAt: now + ttl });
    return Promise.resolve({ ok: true, token, fence, ttl });
  }

  extend(key: string, token: string, ttl: number): Promise<number | null> {
    const now = this.clock();
    const cur = this.live(key, now);
    if (!cur || cur.token !== token) return Promise.resolve(null);
    cur.expiresAt = Math.max(cur.expiresAt, now + ttl);
    return Promise.resolve(cur.expiresAt - now);
  }

  release(key: string, token: string): Promise<boolean> {
    const cur = this.live(key, this.clock());
    if (!cur || cur.token !== token) return Promise.resolve(false);
    if (--cur.holds > 0) return Promise.resolve(true);
    this.locks.delete(key);
    this.wake(key, this.firstLive(key, this.clock()) ?? '');
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
