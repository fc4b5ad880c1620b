// Helpers shared by the core integration tests: bounded waits on events and conditions, and invalid-argument checks.
import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { afterAll, beforeAll, expect } from 'vitest';
import { bucketName } from '../../packages/core/src/rate-limit/bucket-store.js';
import { gcraParams } from '../../packages/core/src/rate-limit/gcra.js';
import { startRedis, stopAll, type RedisNode } from '../harness/redis.js';

/** A prefix no other test uses, so tests on one Redis node never see each other's keys. */
export function uniquePrefix(tag: string): string {
  return `t:${tag}:${randomBytes(4).toString('hex')}:`;
}

/** The Redis name of `key`'s bucket in `bucket` (a TokenBucket, or its settings), which was made with `prefix`. */
export function bucketKey(bucket: { capacity: number; rate: number }, prefix: string, key: string): string {
  return bucketName(prefix, key, gcraParams(bucket.capacity, bucket.rate));
}

/**
 * Polls `condition` every `intervalMs` until it holds; rejects naming `what` after `timeoutMs`.
 * Used where the thing awaited has no event of its own (a key expiring in Redis, a waiter reaching its queue).
 */
export async function until(
  condition: () => boolean | Promise<boolean>,
  timeoutMs: number,
  what: string,
  intervalMs = 5,
): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    if (await condition()) return;
    if (performance.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
}

/** Resolves with `promise`'s value, or rejects naming `what` if it has not settled within `timeoutMs`. */
export function within<T>(promise: Promise<T>, timeoutMs: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not settle within ${timeoutMs} ms`)), timeoutMs);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** Resolves with the signal's abort reason once it aborts; rejects if it has not aborted within `timeoutMs`. */
export function abortReason(signal: AbortSignal, timeoutMs: number, what = 'the lease signal to abort'): Promise<unknown> {
  if (signal.aborted) return Promise.resolve(signal.reason);
  return within(
    new Promise<unknown>((resolve) => signal.addEventListener('abort', () => resolve(signal.reason), { once: true })),
    timeoutMs,
    what,
  );
}

/** Settles `promise` into its rejection reason; fails the test if it resolves. */
export async function rejection(promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  throw new Error('expected a rejection, but the promise resolved');
}

/**
 * Asserts that `call` fails at once with a TypeError or RangeError whose message names `option`: either it throws
 * synchronously, or it returns a promise that is already rejected (settles before any timer or I/O could run).
 */
export async function expectInvalid(call: () => unknown, option: string): Promise<void> {
  let failed = false;
  let error: unknown;
  let result: unknown;
  try {
    result = call();
  } catch (e) {
    failed = true;
    error = e;
  }
  if (!failed && result instanceof Promise) {
    // An already-rejected promise settles within a few microtask turns; I/O or a timer needs a macrotask.
    const pending = Symbol('pending');
    const settled = await Promise.race([
      result.then(
        () => ({ ok: true as const }),
        (e: unknown) => ({ ok: false as const, e }),
      ),
      new Promise<typeof pending>((resolve) => setImmediate(() => resolve(pending))),
    ]);
    if (settled === pending) {
      result.catch(() => undefined);
      throw new Error(`expected ${option} to be rejected at once, but the call was still pending`);
    }
    if (!settled.ok) {
      failed = true;
      error = settled.e;
    }
  }
  expect(failed, `expected a TypeError or RangeError naming ${option}, but the call succeeded`).toBe(true);
  expect(error instanceof TypeError || error instanceof RangeError, `${String(error)} is a TypeError or RangeError`).toBe(
    true,
  );
  const escaped = option.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  expect((error as Error).message).toMatch(new RegExp(`(^|[^A-Za-z])${escaped}([^A-Za-z]|$)`));
}

/** Calls and failures of one command (INFO commandstats) since the last RESETSTAT, zero when never called. */
export async function commandStats(admin: Redis, name: string): Promise<{ calls: number; failed: number }> {
  const info = await admin.info('commandstats');
  const m = new RegExp(`cmdstat_${name}:calls=(\\d+).*rejected_calls=(\\d+),failed_calls=(\\d+)`).exec(info);
  return m ? { calls: Number(m[1]), failed: Number(m[2]) + Number(m[3]) } : { calls: 0, failed: 0 };
}

/** Script commands (EVALSHA and EVAL, failed ones included) the server ran since the last RESETSTAT. */
export async function scriptCommands(admin: Redis): Promise<number> {
  return (await commandStats(admin, 'evalsha')).calls + (await commandStats(admin, 'eval')).calls;
}

/**
 * A private redis-server for the calling test file: started before its tests, stopped (with every other server the file
 * started) after them. `admin` is a connected client for inspecting it.
 */
export function privateRedis(): { readonly node: RedisNode; readonly admin: Redis } {
  const box: { node?: RedisNode; admin?: Redis } = {};
  beforeAll(async () => {
    box.node = await startRedis();
    box.admin = box.node.client();
    await box.admin.ping();
  });
  afterAll(async () => {
    await stopAll();
  });
  return {
    get node() {
      return box.node!;
    },
    get admin() {
      return box.admin!;
    },
  };
}

/**
 * Counts the refusals of each waiter of `locker` (a RedisLock), from now on. `settled` waits until the first waiter on
 * `key` in this process is subscribed to the key's channel (as the server on `admin` sees it) and has been refused twice
 * since: so the attempt a waiter makes once its subscription is confirmed, and the polls it makes every 50 ms until
 * then, are behind it, and its next attempt is up to a second away. On a loaded machine the subscription can come well
 * after the waiter shows in the line, and those attempts land after whatever the test does next to Redis (deleting
 * the lock, making it refuse writes).
 */
export function refusalCounter(locker: object): { settled(key: string, what: string, admin: Redis, channel: string): Promise<void> } {
  type Store = { local: Map<string, { token: string }[]>; noteAhead(key: string, token: string, ahead: unknown): void };
  const store = (locker as { store: Store }).store;
  const refusals = new Map<string, number>();
  const noteAhead = store.noteAhead.bind(store);
  store.noteAhead = (key, token, ahead) => {
    refusals.set(token, (refusals.get(token) ?? 0) + 1);
    noteAhead(key, token, ahead);
  };
  return {
    async settled(key, what, admin, channel) {
      await until(() => store.local.get(key)?.[0] !== undefined, 3_000, `${what} in this process's line`);
      const token = store.local.get(key)![0]!.token;
      await until(async () => Number((await admin.pubsub('NUMSUB', channel))[1]) > 0, 3_000, `${what} to subscribe`);
      const before = refusals.get(token) ?? 0;
      await until(() => (refusals.get(token) ?? 0) >= before + 2, 5_000, `${what} to be refused twice once subscribed`);
    },
  };
}
