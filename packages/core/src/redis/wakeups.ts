// One subscriber connection per Redis client, shared by every locker on it, so waiters hear a release at once instead
// of polling.
// Channels stay subscribed for a short linger after their last waiter leaves, so a hot key's waiters do not pay a
// SUBSCRIBE round trip each time; the connection is opened on first use, closed after an idle spell, and closed for
// good when the user's client ends, so it never keeps a process alive on its own.
import type { Redis, RedisOptions } from 'ioredis';
import type { RedisClient } from '../types.js';
import { bounded } from './call.js';
import { onNext } from './events.js';

type Listener = (message: string) => void;

interface Channel {
  readonly listeners: Set<Listener>;
  /** Settles when the server confirmed the subscription; undefined until asked (or after a failure). */
  ready: Promise<unknown> | undefined;
  linger: NodeJS.Timeout | undefined;
}

const LINGER_MS = 2_000;
const IDLE_CLOSE_MS = 5_000;

/** Pub/sub wake-ups for one user client. */
export class Wakeups {
  private subscriber: RedisClient | undefined;
  private readonly channels = new Map<string, Channel>();
  private idleTimer: NodeJS.Timeout | undefined;
  private closed = false;
  // Stops waiting for the client's 'end' (shared with the other Wakeups on the client; see onNext).
  private readonly stopWaitingForEnd: () => void;
  /**
   * The client's ioredis `keyPrefix`. ioredis prepends it to the keys of our scripts, so a release publishes on the
   * prefixed name, but not to SUBSCRIBE's channels: we add it ourselves.
   */
  private readonly prefix: string;

  constructor(
    private readonly client: RedisClient,
    private readonly timeout: number,
  ) {
    this.stopWaitingForEnd = onNext(client, 'end', () => this.close());
    const keyPrefix = (client as { options?: { keyPrefix?: unknown } }).options?.keyPrefix;
    this.prefix = typeof keyPrefix === 'string' ? keyPrefix : '';
  }

  /**
   * Calls `listener` with each message on channel `name`. Resolves once the server has confirmed the subscription, so a
   * release published after that cannot be missed. Rejects when the subscription cannot be made in time; callers then
   * fall back to polling.
   */
  async listen(name: string, listener: Listener, timeout = this.timeout): Promise<() => void> {
    if (this.closed) throw new Error('wake-ups closed');
    const channel = this.prefix + name;
    const sub = this.connection();
    let ch = this.channels.get(channel);
    if (ch === undefined) {
      ch = { listeners: new Set(), ready: undefined, linger: undefined };
      this.channels.set(channel, ch);
    }
    if (ch.linger) {
      clearTimeout(ch.linger);
      ch.linger = undefined;
    }
    ch.listeners.add(listener);
    const stop = () => this.unlisten(channel, listener);
    const state = ch;
    // SUBSCRIBE only once the connection is ready: sent during ioredis's handshake, it puts the connection into
    // subscriber mode before the ready check's INFO, which then throws from inside ioredis's event handler.
    state.ready ??= bounded(sub, timeout, async () => {
      await whenReady(sub);
      return sub.subscribe(channel);
    });
    const ready = state.ready;
    try {
      await ready;
    } catch (error) {
      if (state.ready === ready) state.ready = undefined; // the next waiter tries again
      stop();
      throw error;
    }
    return stop;
  }

  /** Whether {@link Wakeups.close} ran (by a call, or at the client's end). */
  get isClosed(): boolean {
    return this.closed;
  }

  /**
   * Closes the subscriber connection; later `listen` calls reject. Current listeners are woken ('' = anyone may try),
   * so a waiter finds out at once (its next attempt fails when the client ended) instead of at its next poll.
   */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.stopWaitingForEnd();
    if (this.idleTimer) clearTimeout(this.idleTimer);
    this.idleTimer = undefined;
    const listeners = [...this.channels.values()].flatMap((ch) => {
      if (ch.linger) clearTimeout(ch.linger);
      return [...ch.listeners];
    });
    this.channels.clear();
    this.subscriber?.disconnect();
    this.subscriber = undefined;
    for (const listener of listeners) listener('');
  }

  private connection(): RedisClient {
    if (this.idleTimer) {
      clearTimeout(this.idleTimer);
      this.idleTimer = undefined;
    }
    if (this.subscriber) return this.subscriber;
    // duplicate() copies the user's connection options (auth, TLS, db) without touching the user's client. A Cluster
    // copy subscribes through ioredis's own subscriber, which does not reconnect (it picks another node, and handles
    // its resubscription's failures). A plain connection resubscribes itself (resubscribe()), not through ioredis's
    // autoResubscribe: ioredis (5.x before its fix #2187) sends that SUBSCRIBE with no rejection handler, so closing
    // the connection before the reply is an unhandled rejection in the user's process.
    const cluster = (this.client as { isCluster?: unknown }).isCluster === true;
    const sub = (cluster ? this.client.duplicate() : (this.client as Redis).duplicate(this.plainOptions())) as RedisClient;
    if (!cluster) {
      let connectedBefore = false;
      sub.on('ready', () => {
        if (connectedBefore) this.resubscribe(sub);
        connectedBefore = true;
      });
    }
    sub.on('error', () => {
      // Connection errors surface as failed/slow wake-ups and the waiters' polling fallback; nothing to report here.
    });
    sub.on('message', (channel: string, message: string) => this.deliver(channel, message));
    sub.on('smessage', (channel: string, message: string) => this.deliver(channel, message));
    // A copy of a `lazyConnect` client waits for a first command to connect, and SUBSCRIBE waits for it to be ready:
    // connect it now, or no waiter would ever hear a release (each would wait for its poll instead).
    if ((sub as { status?: string }).status === 'wait') {
      sub.connect().catch(() => {
        // A failed connect is a failed subscription: the waiters poll.
      });
    }
    this.subscriber = sub;
    return sub;
  }

  /**
   * Options of a plain connection's copy. Its reconnects follow the user's retryStrategy, and stop (closing these
   * wake-ups) once the user has closed the client: a client quit or disconnected while it was reconnecting emits no
   * 'end' (ioredis has no connection left to close then), so without this the copy would reconnect on its own, keeping
   * the process alive until the idle close, or for good while a waiter listens.
   */
  private plainOptions(): RedisOptions {
    const client = this.client as Redis;
    const retry = client.options.retryStrategy;
    return {
      autoResubscribe: false,
      retryStrategy:
        typeof retry !== 'function'
          ? retry
          : (times) => {
              // ioredis sets this on quit() and disconnect(), and clears it only when a connection closes.
              if ((client as unknown as { manuallyClosing?: unknown }).manuallyClosing === true || client.status === 'end') {
                this.close();
                return null;
              }
              return retry(times);
            },
    };
  }

  /**
   * After a reconnect: subscribes every channel again, then wakes their listeners ('' = anyone may try), since a release
   * published while the connection was down was lost and a waiter would otherwise wait for its next poll.
   */
  private resubscribe(sub: RedisClient): void {
    if (this.subscriber !== sub || this.channels.size === 0) return;
    const wake = () => {
      if (this.subscriber !== sub) return;
      for (const ch of this.channels.values()) for (const listener of [...ch.listeners]) listener('');
    };
    // Not bounded: a SUBSCRIBE the server never answers is failed by the connection's next close, and until then the
    // waiters poll as they would without wake-ups.
    sub.subscribe(...this.channels.keys()).then(wake, wake);
  }

  private deliver(channel: string, message: string): void {
    const ch = this.channels.get(channel);
    if (!ch) return;
    for (const listener of [...ch.listeners]) listener(message);
  }

  private unlisten(channel: string, listener: Listener): void {
    const ch = this.channels.get(channel);
    if (!ch?.listeners.delete(listener) || ch.listeners.size > 0) return;
    ch.linger = setTimeout(() => {
      if (ch.listeners.size > 0 || this.channels.get(channel) !== ch) return;
      this.channels.delete(channel);
      this.subscriber?.unsubscribe(channel).catch(() => {
        // A failed UNSUBSCRIBE only leaves a harmless subscription behind; the idle close removes it.
      });
      if (this.channels.size === 0) this.scheduleIdleClose();
    }, LINGER_MS);
    ch.linger.unref();
  }

  private scheduleIdleClose(): void {
    const sub = this.subscriber;
    this.idleTimer = setTimeout(() => {
      this.idleTimer = undefined;
      if (this.channels.size === 0 && this.subscriber === sub) {
        this.subscriber = undefined;
        sub?.disconnect();
      }
    }, IDLE_CLOSE_MS);
    this.idleTimer.unref();
  }
}

// The Wakeups of each client, and how many lockers use it.
const shared = new WeakMap<RedisClient, { wakeups: Wakeups; users: number }>();

/**
 * A locker's share of its client's {@link Wakeups}: the client's one subscriber connection serves every locker on it.
 * Closing the share wakes and drops only this locker's listeners; the last share to close closes the Wakeups.
 */
export class WakeupShare {
  private readonly active = new Set<{ listener: Listener; stop: (() => void) | undefined }>();
  private closed = false;

  private constructor(
    private readonly client: RedisClient,
    private readonly wakeups: Wakeups,
    private readonly timeout: number,
  ) {}

  /**
   * A share of `client`'s Wakeups, made on first use (and again after the client ended); this share's subscriptions
   * give up after `timeout` ms.
   */
  static of(client: RedisClient, timeout: number): WakeupShare {
    let entry = shared.get(client);
    if (entry === undefined || entry.wakeups.isClosed) {
      entry = { wakeups: new Wakeups(client, timeout), users: 0 };
      shared.set(client, entry);
    }
    entry.users++;
    return new WakeupShare(client, entry.wakeups, timeout);
  }

  /** See {@link Wakeups.listen}. */
  async listen(name: string, listener: Listener): Promise<() => void> {
    if (this.closed) throw new Error('wake-ups closed');
    const entry: { listener: Listener; stop: (() => void) | undefined } = { listener, stop: undefined };
    this.active.add(entry);
    let stop: () => void;
    try {
      stop = await this.wakeups.listen(name, listener, this.timeout);
    } catch (error) {
      this.active.delete(entry);
      throw error;
    }
    if (this.closed) {
      // Closed while the subscription was on its way (close() woke the listener already).
      stop();
      throw new Error('wake-ups closed');
    }
    entry.stop = stop;
    return () => {
      if (this.active.delete(entry)) stop();
    };
  }

  /** Stops and wakes this share's listeners ('' = anyone may try); the last share of the client closes its Wakeups. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    const entries = [...this.active];
    this.active.clear();
    for (const e of entries) e.stop?.();
    const entry = shared.get(this.client);
    if (entry?.wakeups === this.wakeups && --entry.users === 0) {
      shared.delete(this.client);
      this.wakeups.close();
    }
    for (const e of entries) e.listener('');
  }
}

// The wait for each subscriber connection's next 'ready', shared by every channel asked for meanwhile: one listener
// per connection, not one per channel, which would pile up (and trip Node's MaxListenersExceededWarning) while a
// connection that is down keeps timing subscriptions out.
const readyWaits = new WeakMap<RedisClient, Promise<void>>();

/** Resolves once `client` is ready for commands; never rejects (the caller's bound decides how long to wait). */
function whenReady(client: RedisClient): Promise<void> {
  if (client.status === 'ready') return Promise.resolve();
  let wait = readyWaits.get(client);
  if (wait === undefined) {
    wait = new Promise((resolve) =>
      client.once('ready', () => {
        readyWaits.delete(client);
        resolve();
      }),
    );
    readyWaits.set(client, wait);
  }
  return wait;
}
