// The shop's orders: how many purchases each one had, guarded by the lock's fencing token, and a slow fake payment.
import { setTimeout as sleep } from 'node:timers/promises';
import type { Redis } from 'ioredis';

/** What GET /orders/:id shows. */
export interface Order {
  id: string;
  /** Purchases recorded for this order; the per-order lock keeps it at 0 or 1. */
  purchases: number;
  /** The fence of the lease that recorded the last purchase (0: none yet). */
  fence: number;
}

/** A write carried a fence lower than one already seen: its lease was lost and someone else holds the lock now. */
export class StaleFenceError extends Error {
  readonly status = 409;
  readonly expose = true;
  readonly code = 'STALE_FENCE';
}

/** Purchases per order, in memory or in Redis. */
export interface OrderBook {
  get(id: string): Promise<Order>;
  /**
   * Records one purchase made under a lease with this fence. Refuses a fence not above the last one recorded, so a
   * holder that stalled past its lease (GC pause, stopped VM) cannot write after the next holder did.
   * @throws StaleFenceError
   */
  recordPurchase(id: string, fence: number): Promise<Order>;
}

/** The order book of one process. */
export class MemoryOrderBook implements OrderBook {
  private readonly orders = new Map<string, Order>();

  async get(id: string): Promise<Order> {
    return { ...(this.orders.get(id) ?? { id, purchases: 0, fence: 0 }) };
  }

  async recordPurchase(id: string, fence: number): Promise<Order> {
    const order = await this.get(id);
    if (fence <= order.fence) throw new StaleFenceError(`order ${id}: fence ${fence} is not above ${order.fence}`);
    const next = { id, purchases: order.purchases + 1, fence };
    this.orders.set(id, next);
    return { ...next };
  }
}

// KEYS[1]: the order's hash. ARGV[1]: the writer's fence. Returns the new purchase count, or -1 for a stale fence.
const RECORD_PURCHASE = `
local fence = tonumber(ARGV[1])
local last = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if fence <= last then return -1 end
redis.call('HSET', KEYS[1], 'fence', ARGV[1])
redis.call('EXPIRE', KEYS[1], 86400)
return redis.call('HINCRBY', KEYS[1], 'purchases', 1)
`;

/** The order book in Redis, shared by every instance of the shop (orders are kept for a day). */
export class RedisOrderBook implements OrderBook {
  constructor(private readonly redis: Redis) {}

  async get(id: string): Promise<Order> {
    const h = await this.redis.hgetall(orderKey(id));
    return { id, purchases: Number(h.purchases ?? 0), fence: Number(h.fence ?? 0) };
  }

  async recordPurchase(id: string, fence: number): Promise<Order> {
    const purchases = Number(await this.redis.eval(RECORD_PURCHASE, 1, orderKey(id), String(fence)));
    if (purchases < 0) throw new StaleFenceError(`order ${id}: fence ${fence} is stale`);
    return { id, purchases, fence };
  }
}

function orderKey(id: string): string {
  return `shop:order:${id}`;
}

/**
 * A payment provider that takes a while (`ms`, from PAYMENT_MS, default 1500), long enough to double-click or to
 * retry. Stops at once when `signal` aborts, i.e. when the lock is lost.
 */
export async function pay(orderId: string, ms: number, signal: AbortSignal): Promise<{ paymentId: string }> {
  await sleep(ms, undefined, { signal });
  return { paymentId: `pay_${orderId}_${Date.now().toString(36)}` };
}
