// One shared subscriber connection per Redis client, so waiters hear a release at once instead of polling.
// Subscriptions are reference-counted per channel; the connection is opened on first use, closed after a short
// idle spell, and closed for good when the user's client ends, so it never keeps a process alive on its own.
import type { RedisClient } from '../types.js';
import { bounded } from './call.js';

type Listener = () => void;

const IDLE_CLOSE_MS = 5_000;

/** Pub/sub wake-ups for one user client. */
export class Wakeups {
  private subscriber: RedisClient | undefined;
  private readonly listeners = new Map<string, Set<Listener>>();
  private idleTimer: NodeJS.Timeout | undefined;
  private closed = false;
  private readonly onClientEnd = () => this.close();

  constructor(
    private readonly client: RedisClient,
    private readonly timeout: number,
  ) {
    client.once('end', this.onClientEnd);
  }

  /**
   * Calls `listener` whenever a message arrives on `channel`. Resolves once the server has confirmed the subscription,
   * so a release published after that cannot be missed. Rejects when the subscription cannot be made in time; callers
   * then fall back to polling.
   */
  async listen(channel: string, listener: Listener): Promise<() => void> {
    if (this.closed) throw new Error('wake-ups closed');
    const sub = this.connection();
    let set = this.listeners.get(channel);
    if (set === undefined) {
      set = new Set();
      this.listeners.set(channel, set);
    }
    set.add(listener);
    const stop = () => this.unlisten(channel, listener);
    try {
      // Always await a SUBSCRIBE round trip, even when the channel is already subscribed: the reply proves the
      // earlier SUBSCRIBE is active too (replies arrive in order).
      await bounded(sub, this.timeout, () => sub.subscribe(channel));
    } catch (error) {
      stop();
      throw error;
    }
    return stop;
  }

  /** Closes the subscriber connection; later `listen` calls reject. */
  close(): void {
    this.closed = true;
    this.client.off('end', this.onClientEnd);
    if (this.idleTimer) clearTimeout(this.idleTimer);
    this.idleTimer = undefined;
    this.listeners.clear();
    this.subscriber?.disconnect();
    this.subscriber = undefined;
  }

  private connection(): RedisClient {
    if (this.idleTimer) {
      clearTimeout(this.idleTimer);
      this.idleTimer = undefined;
    }
    if (this.subscriber) return this.subscriber;
    // duplicate() copies the user's connection options (auth, TLS, db) without touching the user's client.
    const sub = this.client.duplicate() as RedisClient;
    sub.on('error', () => {
      // Connection errors surface as failed/slow wake-ups and the waiters' polling fallback; nothing to report here.
    });
    sub.on('message', (channel: string) => this.deliver(channel));
    sub.on('smessage', (channel: string) => this.deliver(channel));
    this.subscriber = sub;
    return sub;
  }

  private deliver(channel: string): void {
    const set = this.listeners.get(channel);
    if (!set) return;
    for (const listener of [...set]) listener();
  }

  private unlisten(channel: string, listener: Listener): void {
    const set = this.listeners.get(channel);
    if (!set?.delete(listener)) return;
    if (set.size > 0) return;
    this.listeners.delete(channel);
    const sub = this.subscriber;
    if (!sub) return;
    sub.unsubscribe(channel).catch(() => {
      // A failed UNSUBSCRIBE only leaves a harmless subscription behind; the idle close removes it.
    });
    if (this.listeners.size === 0) {
      this.idleTimer = setTimeout(() => {
        this.idleTimer = undefined;
        if (this.listeners.size === 0 && this.subscriber === sub) {
          this.subscriber = undefined;
          sub.disconnect();
        }
      }, IDLE_CLOSE_MS);
      this.idleTimer.unref();
    }
  }
}
