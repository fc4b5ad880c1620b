// Where the shop keeps its limits, locks and orders, chosen from the environment: memory, one Redis, or Redlock nodes.
import { Redis } from 'ioredis';
import { MemoryOrderBook, RedisOrderBook, type OrderBook } from './orders.js';

/** What the routes need: the Redis option of rateLimit() and withLock(), and the order book. */
export interface Stores {
  /** `memory`: this process only; `redis`: one Redis; `redlock`: locks over several independent masters. */
  readonly mode: 'memory' | 'redis' | 'redlock';
  /** A one-line description for the start-up banner. */
  readonly description: string;
  /** Where the rate-limit buckets live (undefined: in memory). */
  readonly redis: Redis | undefined;
  /** withLock's `redis` option: one client gives a RedisLock, several a Redlock, none the shared MemoryLock. */
  readonly lockRedis: Redis | Redis[] | undefined;
  /** Purchases per order. */
  readonly orders: OrderBook;
  /** Closes the Redis connections. */
  close(): Promise<void>;
}

/**
 * Reads `REDIS_URL` (one Redis for limits, locks and orders) and `REDIS_NODES` (comma-separated URLs of independent
 * masters: locks use Redlock over all of them; limits and orders use `REDIS_URL`, else the first node).
 * With neither, everything stays in this process's memory.
 */
export function storesFromEnv(env: NodeJS.ProcessEnv = process.env): Stores {
  const url = env.REDIS_URL?.trim() || undefined;
  const nodes = (env.REDIS_NODES ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s.length > 0);

  if (url === undefined && nodes.length === 0) {
    return {
      mode: 'memory',
      description: 'memory (this process only; set REDIS_URL or REDIS_NODES to share limits and locks between processes)',
      redis: undefined,
      lockRedis: undefined,
      orders: new MemoryOrderBook(),
      close: async () => {},
    };
  }

  const nodeClients = nodes.map(connect);
  const redis = url !== undefined ? connect(url) : nodeClients[0]!;
  const all = url !== undefined ? [redis, ...nodeClients] : nodeClients;
  const redlock = nodeClients.length > 1;
  return {
    mode: redlock ? 'redlock' : 'redis',
    description: redlock
      ? `redlock over ${nodes.length} nodes (${nodes.map(redact).join(', ')}); limits and orders on ${redact(url ?? nodes[0]!)}`
      : `redis (${redact(url ?? nodes[0]!)})`,
    redis,
    lockRedis: redlock ? nodeClients : (nodeClients[0] ?? redis),
    orders: new RedisOrderBook(redis),
    close: async () => {
      // quit() lets pending replies arrive; a client that is not connected has nothing pending and would only retry.
      await Promise.all(all.map((c) => (c.status === 'ready' ? c.quit().then(() => undefined, () => c.disconnect()) : c.disconnect())));
    },
  };
}

function connect(url: string): Redis {
  const client = new Redis(url);
  // ioredis reconnects by itself; without a listener every failed attempt prints "Unhandled error event".
  let reported = false;
  client.on('error', (err: Error) => {
    if (reported) return;
    reported = true;
    console.warn(`redis ${redact(url)}: ${err.message} (retrying in the background)`);
  });
  client.on('ready', () => {
    reported = false;
  });
  return client;
}

// Never print a password from the URL.
function redact(url: string): string {
  return url.replace(/\/\/[^@/]*@/, '//***@');
}

/**
 * rateLimit's `onStoreState` for the shop: tells the operators when the limits fall back to per-process buckets (their
 * Redis is down, so each process counts alone) and when they are shared again.
 */
export function logStoreState(policy: string): (event: { state: 'down' | 'up'; error?: unknown }) => void {
  return ({ state, error }) => {
    if (state === 'down') console.warn(`[limits] ${policy}: Redis down, counting in this process until it is back:`, (error as Error).message);
    else console.warn(`[limits] ${policy}: Redis back, limits shared again`);
  };
}
