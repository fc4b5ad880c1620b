// Shared pieces of the Redlock fault tests: five private masters, Redlocks with their own connections, a view of
// what each node stores, and waits on ioredis connection states (events, bounded in time).
import type { Redis } from 'ioredis';
import { Redlock, type RedlockOptions } from '../../packages/core/src/index.js';
import { lockNames } from '../../packages/core/src/lock/redis-store.js';
import { afterAll, beforeAll } from 'vitest';
import { startRedisNodes, stopAll, type RedisNode } from '../harness/redis.js';
import { uniquePrefix, within } from '../core/helpers.js';

/** How long a node may take to come back (restart and ioredis reconnect, whose backoff grows to 2 s). */
export const RECONNECT_MS = 10_000;

/** Five masters with one always-reconnecting admin connection each, for looking at what the nodes store. */
export class Nodes {
  readonly admins: Redis[];

  constructor(readonly nodes: RedisNode[]) {
    // No retry budget per command: an admin command on a dead node should fail, not sit in the offline queue.
    this.admins = nodes.map((n) => n.client({ maxRetriesPerRequest: 0 }));
  }

  // Every Redlock made here, closed (with its connections) by close().
  private readonly made: { locker: Redlock; clients: Redis[] }[] = [];

  /**
   * A Redlock with its own connection to each of the first `count` nodes (every node by default); the connections are
   * returned for state checks. close() closes both.
   */
  redlock(options: RedlockOptions = {}, count = this.nodes.length): { locker: Redlock; clients: Redis[] } {
    const clients = this.nodes.slice(0, count).map((n) => n.client());
    const made = { locker: new Redlock(clients, options), clients };
    this.made.push(made);
    return made;
  }

  /** Every key on node `i` (a test's own prefix keeps the listing small). */
  async keys(i: number, pattern = '*'): Promise<string[]> {
    return (await this.admins[i]!.keys(pattern)).sort();
  }

  /** The fence stored on node `i` for `key`, or null when the node has none. */
  async fenceOn(i: number, prefix: string, key: string): Promise<number | null> {
    const v = await this.admins[i]!.get(lockNames(prefix, key).fence);
    return v === null ? null : Number(v);
  }

  /**
   * The lock on node `i` for `key` (token, fence, number of holds, waiters flag, owner), or null when the key is free
   * there. (A lock with an owner stores its holds' ids, a lock without one '1'.)
   */
  async lockOn(i: number, prefix: string, key: string): Promise<Record<'t' | 'f' | 'n' | 'w' | 'o', string> | null> {
    const v = await this.admins[i]!.get(lockNames(prefix, key).lock);
    if (v === null) return null;
    const m = /^(\S+) (\d+) (1|[\w-]{8}:\d+(?:,[\w-]{8}:\d+)*) (\d) ([\s\S]*)$/.exec(v);
    if (m === null) throw new Error(`unexpected lock value on node ${i}: ${JSON.stringify(v)}`);
    return { t: m[1]!, f: m[2]!, n: String(m[3]!.split(',').length), w: m[4]!, o: m[5]! };
  }

  /** Nodes killed and not restarted yet. */
  readonly killed = new Set<number>();
  /** Nodes paused (SIGSTOP) and not resumed yet. */
  readonly paused = new Set<number>();

  /** SIGKILLs nodes `ids` and waits until `clients` (and the admin connections) have noticed. */
  async kill(ids: readonly number[], clients: readonly Redis[][] = []): Promise<void> {
    for (const i of ids) {
      this.killed.add(i);
      this.paused.delete(i);
    }
    await Promise.all(ids.map((i) => this.nodes[i]!.kill()));
    await Promise.all(ids.flatMap((i) => [this.admins[i]!, ...clients.map((c) => c[i]!)]).map((c) => notReady(c)));
  }

  /** Restarts nodes `ids` (empty: no persistence) and waits until `clients` and the admin connections are ready. */
  async restart(ids: readonly number[], clients: readonly Redis[][] = []): Promise<void> {
    await Promise.all(ids.map((i) => this.nodes[i]!.restart()));
    for (const i of ids) {
      this.killed.delete(i);
      this.paused.delete(i);
    }
    await Promise.all(ids.flatMap((i) => [this.admins[i]!, ...clients.map((c) => c[i]!)]).map((c) => ready(c)));
  }

  /** SIGSTOPs nodes `ids`: they keep their connections but answer nothing. */
  pause(ids: readonly number[]): void {
    for (const i of ids) {
      this.nodes[i]!.pause();
      this.paused.add(i);
    }
  }

  /** SIGCONTs nodes `ids`. */
  resume(ids: readonly number[]): void {
    for (const i of ids) {
      this.nodes[i]!.resume();
      this.paused.delete(i);
    }
  }

  /** Resumes every paused node (a no-op on running ones); nodes that are not running are left alone. */
  resumeAll(): void {
    for (const n of this.nodes) {
      try {
        n.resume();
      } catch {
        // not running
      }
    }
    this.paused.clear();
  }

  /** Brings every node back: resumes the paused ones, restarts the killed ones, and waits for the admin connections. */
  async heal(): Promise<void> {
    this.resumeAll();
    if (this.killed.size > 0) await this.restart([...this.killed]);
    await Promise.all(this.admins.map((a) => ready(a)));
  }

  /** Indices of the nodes where `key`'s lock hash exists (asked of every live node; dead ones are skipped). */
  async holders(prefix: string, key: string): Promise<number[]> {
    const live = this.nodes.map((_, i) => i).filter((i) => !this.killed.has(i) && !this.paused.has(i));
    const held = await Promise.all(live.map(async (i) => ((await this.lockOn(i, prefix, key)) === null ? -1 : i)));
    return held.filter((i) => i >= 0);
  }

  /** Closes the Redlocks made by {@link Nodes.redlock} and every connection. */
  close(): void {
    for (const { locker, clients } of this.made.splice(0)) {
      locker.close();
      for (const c of clients) c.disconnect();
    }
    for (const a of this.admins) a.disconnect();
  }
}

/** Starts `count` private masters before the calling file's tests and stops them after; the function returns them. */
export function privateNodes(count: number): () => Nodes {
  let nodes: Nodes | undefined;
  beforeAll(async () => {
    nodes = new Nodes(await startRedisNodes(count));
  });
  afterAll(async () => {
    nodes?.close();
    await stopAll();
  });
  return () => nodes!;
}

/** A fresh prefix for one test: keeps its keys apart from every other test's on the shared nodes. */
export function freshPrefix(tag: string): string {
  return uniquePrefix(`redlock:${tag}`);
}

/** Resolves once `client` is connected and ready (ioredis 'ready' event), within {@link RECONNECT_MS}. */
export function ready(client: Redis): Promise<void> {
  if (client.status === 'ready') return Promise.resolve();
  return within(
    new Promise<void>((resolve) => client.once('ready', () => resolve())),
    RECONNECT_MS,
    `reconnect to port ${String(client.options.port)}`,
  );
}

/** Resolves once `client` has seen its connection close (status no longer 'ready'). */
export function notReady(client: Redis): Promise<void> {
  if (client.status !== 'ready') return Promise.resolve();
  return within(
    new Promise<void>((resolve) => client.once('close', () => resolve())),
    RECONNECT_MS,
    `port ${String(client.options.port)} to close`,
  );
}

/** Index of the first element not strictly greater than its predecessor, or -1. */
export function firstNonIncreasing(values: readonly number[]): number {
  for (let i = 1; i < values.length; i++) if (!(values[i]! > values[i - 1]!)) return i;
  return -1;
}

/** Milliseconds `fn` took, with its outcome. */
export async function timed<T>(fn: () => Promise<T>): Promise<{ ms: number; value?: T; error?: unknown }> {
  const started = performance.now();
  try {
    const value = await fn();
    return { ms: performance.now() - started, value };
  } catch (error) {
    return { ms: performance.now() - started, error };
  }
}

/** Collects unhandled rejections while installed; tests assert the list stays empty. */
export function trackUnhandled(): { reasons: unknown[]; stop(): void } {
  const reasons: unknown[] = [];
  const onRejection = (reason: unknown) => reasons.push(reason);
  process.on('unhandledRejection', onRejection);
  return { reasons, stop: () => process.off('unhandledRejection', onRejection) };
}
