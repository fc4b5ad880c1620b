// LockStore over one Redis node or Cluster: each operation is one script call, bounded in time.
import { LockUnavailableError } from '../errors.js';
import { bounded } from '../redis/call.js';
import { keyStem } from '../redis/keys.js';
import { Wakeups } from '../redis/wakeups.js';
import type { RedisClient } from '../types.js';
import { ACQUIRE, EXTEND, LEAVE, RELEASE } from './scripts.lua.js';
import type { AttemptResult, LockStore } from './store.js';

/** How long a fence key outlives its lock, in ms; see "Fencing tokens" in the README. */
export const FENCE_RETENTION_MS = 3_600_000;

/**
 * Ms a queued waiter stays in line without re-attempting. Waiters re-attempt at least every second (the polling
 * fallback), so only a waiter that crashed or went away drops out, after at most this long.
 */
export const QUEUE_HEARTBEAT_MS = 3_000;

/** Drift allowance shared by the Redis backends: ttl × factor + 2 ms. */
export function driftFor(ttl: number, factor: number): number {
  return Math.floor(ttl * factor) + 2;
}

/** Redis names of one lock key. */
export function lockNames(prefix: string, key: string): LockNames {
  const stem = keyStem(prefix, key);
  return { lock: stem, fence: `${stem}:f`, queue: `${stem}:q`, deadlines: `${stem}:d`, channel: `${stem}:w` };
}

export interface LockNames {
  lock: string;
  fence: string;
  queue: string;
  deadlines: string;
  channel: string;
}

function isOne(reply: unknown): boolean {
  return reply === 1;
}

/** Parses the ACQUIRE script's reply. */
export function parseAttempt(reply: unknown): AttemptResult {
  const r = reply as [number, string | number, string?, number?];
  if (r[0] === 1) return { ok: true, token: String(r[1]), fence: Number(r[2]), ttl: Number(r[3]) };
  return { ok: false, pttl: Number(r[1]) };
}

export class RedisLockStore implements LockStore {
  private readonly wakeups: Wakeups;

  constructor(
    private readonly client: RedisClient,
    private readonly prefix: string,
    private readonly timeout: number,
    private readonly driftFactor: number,
  ) {
    this.wakeups = new Wakeups(client, timeout);
  }

  attempt(key: string, token: string, owner: string, ttl: number, queue: boolean): Promise<AttemptResult> {
    const n = lockNames(this.prefix, key);
    return this.call(
      'acquire',
      () =>
        ACQUIRE.run(
          this.client,
          [n.lock, n.fence, n.queue, n.deadlines],
          [token, ttl, owner, '', FENCE_RETENTION_MS, queue ? '1' : '0', QUEUE_HEARTBEAT_MS],
        ),
      // An acquire that lands after we gave up would hold the key until its ttl: hand it back.
      (late) => {
        const r = parseAttempt(late);
        if (r.ok && r.token === token) this.releaseScript(n, token).catch(() => undefined);
      },
    ).then(parseAttempt);
  }

  async leave(key: string, token: string): Promise<void> {
    const n = lockNames(this.prefix, key);
    await this.call('leave', () => LEAVE.run(this.client, [n.lock, n.queue, n.deadlines], [token, n.channel]));
  }

  async extend(key: string, token: string, ttl: number): Promise<number | null> {
    const n = lockNames(this.prefix, key);
    const left = Number(await this.call('extend', () => EXTEND.run(this.client, [n.lock], [token, ttl])));
    return left < 0 ? null : left;
  }

  release(key: string, token: string): Promise<boolean> {
    const n = lockNames(this.prefix, key);
    return this.call('release', () => this.releaseScript(n, token)).then(isOne);
  }

  listen(key: string, wake: (next: string) => void): Promise<() => void> {
    return this.wakeups.listen(lockNames(this.prefix, key).channel, wake);
  }

  drift(ttl: number): number {
    return driftFor(ttl, this.driftFactor);
  }

  now(): number {
    return Date.now();
  }

  close(): void {
    this.wakeups.close();
  }

  private releaseScript(n: LockNames, token: string): Promise<unknown> {
    return RELEASE.run(this.client, [n.lock, n.queue, n.deadlines], [token, n.channel, '1']);
  }

  // A plain promise chain, not an async function: this runs twice per lock cycle, and every await costs a tick.
  private call<T>(what: string, op: () => Promise<T>, late?: (result: T) => void): Promise<T> {
    return bounded(this.client, this.timeout, op, late).catch((error: unknown) => {
      throw new LockUnavailableError(`lock ${what} failed: ${(error as Error).message}`, { cause: error });
    });
  }
}
