// One adapter per lock library, so every case drives them the same way: each worker gets a handle on its key and
// calls acquire() / release(). Every library gets the same ioredis clients (one connection per node, default options).
import { Redlock as HaspRedlock, RedisLock } from '@hasp/core';
import { Redlock as SesameRedlock } from '@sesamecare-oss/redlock';
import { Redis } from 'ioredis';
import { Mutex, RedlockMutex } from 'redis-semaphore';
import Redlock4 from 'redlock4';
import Redlock5 from 'redlock5';

/** The lock implementations the benchmark knows. */
export type LockLibId = 'local' | 'hasp' | 'hasp-redlock' | 'redlock5' | 'redlock4' | 'sesame' | 'rs-mutex' | 'rs-redlock';

/** `default`: the library's own waiting settings; `tuned`: the fastest polling it offers. */
export type WaitMode = 'default' | 'tuned';

export interface LockSpec {
  lib: LockLibId;
  /** How many Redis nodes (the first `nodes` of the run's servers). */
  nodes: number;
  mode: WaitMode;
  /** Whether the case waits for a busy lock (contended) or expects it free (uncontended). */
  waits: boolean;
  /**
   * Contended only: how many instances of the library, each with connections of its own, share the workers (default
   * 1). With 2, the workers take turns between two clients as between two processes: nothing in one client knows the
   * other's waiters.
   */
  clients?: number;
}

/** One worker's view of one key. */
export interface LockHandle {
  acquire(): Promise<void>;
  release(): Promise<void>;
}

export interface LockLib {
  handle(key: string): LockHandle;
  close(): Promise<void>;
}

/** Lease ttl for every library: long enough never to expire during a cycle. */
export const TTL_MS = 10_000;
/** hasp's `wait` when a case waits: the same budget redis-semaphore uses by default (acquireTimeout 10 s). */
export const HASP_WAIT_MS = 10_000;
/** The tuned polling settings: a 10 s budget like the default of redis-semaphore, at the tightest useful interval. */
const TUNED_REDLOCK = { retryCount: 5_000, retryDelay: 2, retryJitter: 1 } as const;
const TUNED_SEMAPHORE = { retryInterval: 1 } as const;

/** Human-readable name of a spec, used in tables. */
export function lockLabel(spec: LockSpec): string {
  const n = spec.nodes;
  const names: Record<LockLibId, string> = {
    local: 'in-process mutex (ceiling)',
    hasp: 'hasp RedisLock',
    'hasp-redlock': `hasp Redlock (${n} node${n > 1 ? 's' : ''})`,
    redlock5: 'redlock 5.0.0-beta.2',
    redlock4: 'redlock 4.2.0',
    sesame: '@sesamecare-oss/redlock',
    'rs-mutex': 'redis-semaphore Mutex',
    'rs-redlock': 'redis-semaphore RedlockMutex',
  };
  const wait = spec.waits && spec.lib !== 'local' && !spec.lib.startsWith('hasp') ? ` [${spec.mode}]` : '';
  const clients = (spec.clients ?? 1) > 1 ? `, ${spec.clients} clients` : '';
  return names[spec.lib] + wait + clients;
}

/** Whether a library is hasp (for ratios against the best peer). */
export function isHasp(lib: LockLibId): boolean {
  return lib === 'hasp' || lib === 'hasp-redlock';
}

export async function connect(ports: readonly number[]): Promise<Redis[]> {
  const clients = ports.map((port) => new Redis({ port, host: '127.0.0.1' }));
  await Promise.all(clients.map((c) => c.ping()));
  return clients;
}

export async function makeLockLib(spec: LockSpec, ports: readonly number[]): Promise<LockLib> {
  const clients = spec.lib === 'local' ? [] : await connect(ports.slice(0, spec.nodes));
  const close = async () => {
    await Promise.all(clients.map((c) => c.quit().catch(() => undefined)));
  };
  const tuned = spec.mode === 'tuned';
  switch (spec.lib) {
    case 'local':
      return { handle: localMutex(), close };
    case 'hasp':
    case 'hasp-redlock': {
      const locker = spec.lib === 'hasp' ? new RedisLock(clients[0]!, { ttl: TTL_MS }) : new HaspRedlock(clients, { ttl: TTL_MS });
      const wait = spec.waits ? HASP_WAIT_MS : 0;
      return {
        handle(key) {
          let lease: Awaited<ReturnType<RedisLock['acquire']>> | undefined;
          return {
            async acquire() {
              lease = await locker.acquire(key, { wait });
            },
            async release() {
              const l = lease!;
              lease = undefined;
              await l.release();
            },
          };
        },
        close: async () => {
          locker.close();
          await close();
        },
      };
    }
    case 'redlock5':
    case 'sesame': {
      const settings = tuned ? TUNED_REDLOCK : {};
      const rl = spec.lib === 'redlock5' ? new Redlock5(clients, settings) : new SesameRedlock(clients, settings);
      // Both emit 'error' for every vote against (a busy key); without a listener EventEmitter would throw.
      rl.on('error', () => undefined);
      return {
        handle(key) {
          let lock: { release(): Promise<unknown> } | undefined;
          return {
            async acquire() {
              lock = await rl.acquire([key], TTL_MS);
            },
            async release() {
              const l = lock!;
              lock = undefined;
              await l.release();
            },
          };
        },
        close,
      };
    }
    case 'redlock4': {
      const rl = new Redlock4(clients, tuned ? TUNED_REDLOCK : {});
      rl.on('clientError', () => undefined);
      return {
        handle(key) {
          let lock: Redlock4.Lock | undefined;
          return {
            async acquire() {
              lock = await rl.lock(key, TTL_MS);
            },
            async release() {
              const l = lock!;
              lock = undefined;
              await l.unlock();
            },
          };
        },
        close,
      };
    }
    case 'rs-mutex':
    case 'rs-redlock': {
      const options = { lockTimeout: TTL_MS, ...(tuned ? TUNED_SEMAPHORE : {}) };
      return {
        handle(key) {
          const m = spec.lib === 'rs-mutex' ? new Mutex(clients[0]!, key, options) : new RedlockMutex(clients, key, options);
          return { acquire: () => m.acquire(), release: () => m.release() };
        },
        close,
      };
    }
  }
}

/** A perfect in-process FIFO mutex per key: the zero-cost hand-off the contended case compares against. */
function localMutex(): (key: string) => LockHandle {
  const queues = new Map<string, { held: boolean; waiting: (() => void)[] }>();
  return (key) => {
    let q = queues.get(key);
    if (!q) queues.set(key, (q = { held: false, waiting: [] }));
    const state = q;
    return {
      acquire() {
        if (!state.held) {
          state.held = true;
          return Promise.resolve();
        }
        return new Promise<void>((resolve) => state.waiting.push(resolve));
      },
      release() {
        const next = state.waiting.shift();
        if (next) next();
        else state.held = false;
        return Promise.resolve();
      },
    };
  };
}
