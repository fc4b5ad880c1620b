// The two places a token bucket can live: this process's memory, or Redis (one script call per take).
import { RateLimitUnavailableError } from '../errors.js';
import { bounded } from '../redis/call.js';
import { keyStem } from '../redis/keys.js';
import type { Decision, RedisClient } from '../types.js';
import { TAKE } from './bucket.lua.js';
import { decide, type GcraParams } from './gcra.js';

export interface BucketStore {
  take(key: string, cost: number, commit: boolean): Promise<Decision>;
  reset(key: string): Promise<void>;
}

export class MemoryBucketStore implements BucketStore {
  private readonly tats = new Map<string, number>();
  // Walks the map a little on every take, dropping buckets that are full again, so memory follows the active keys.
  private sweeper: Iterator<[string, number]> | undefined;

  constructor(
    private readonly params: GcraParams,
    private readonly clock: () => number,
  ) {}

  take(key: string, cost: number, commit: boolean): Promise<Decision> {
    const now = Math.round(this.clock() * 1_000);
    this.sweep(now);
    const { decision, store } = decide(this.params, this.tats.get(key), now, cost, commit);
    if (store !== undefined) {
      // Re-insert so the sweeper meets recently used keys last.
      this.tats.delete(key);
      this.tats.set(key, store);
    }
    return Promise.resolve(decision);
  }

  reset(key: string): Promise<void> {
    this.tats.delete(key);
    return Promise.resolve();
  }

  /** Buckets currently stored (not yet full again). */
  get size(): number {
    return this.tats.size;
  }

  private sweep(now: number): void {
    for (let i = 0; i < 3; i++) {
      this.sweeper ??= this.tats.entries();
      const next = this.sweeper.next();
      if (next.done) {
        this.sweeper = undefined;
        return;
      }
      if (next.value[1] <= now) this.tats.delete(next.value[0]);
    }
  }
}

export class RedisBucketStore implements BucketStore {
  constructor(
    private readonly client: RedisClient,
    private readonly prefix: string,
    private readonly params: GcraParams,
    private readonly timeout: number,
  ) {}

  async take(key: string, cost: number, commit: boolean): Promise<Decision> {
    const name = keyStem(this.prefix, key);
    const reply = (await this.call(() =>
      TAKE.run(this.client, [name], [this.params.capacity, this.params.interval, cost, commit ? '1' : '0']),
    )) as [number, number, number, number];
    return {
      allowed: reply[0] === 1,
      limit: this.params.capacity,
      remaining: reply[1],
      retryAfter: reply[2],
      resetAfter: reply[3],
    };
  }

  async reset(key: string): Promise<void> {
    await this.call(() => this.client.del(keyStem(this.prefix, key)));
  }

  private async call<T>(op: () => Promise<T>): Promise<T> {
    try {
      return await bounded(this.client, this.timeout, op);
    } catch (error) {
      throw new RateLimitUnavailableError(`token bucket store failed: ${(error as Error).message}`, { cause: error });
    }
  }
}
