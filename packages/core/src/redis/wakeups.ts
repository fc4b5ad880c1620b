// One subscriber connection per Redis client, shared by every locker on it, so waiters hear a release at once instead
// of polling.
// Channels stay subscribed for a short linger after their last waiter leaves, so a hot key's waiters do not pay a
// SUBSCRIBE round trip each time; the connection is opened on first use, closed after an idle spell, and closed for
// good when the user's client ends, so it never keeps a process alive on its own.
import type { Redis, RedisOptions } from 'ioredis';
import type { RedisClient } from '../types.js';
import { backoff } from '../util/bounded.js';
import { RedisCallError } from './call.js';
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
const RENEW_MIN_MS = 100;
const RENEW_MAX_MS = 5_000;

/** Pub/sub wake-ups for one user client. */
export class Wakeups {
  private subscriber: RedisClient | undefined;
  private readonly channels = new Map<string, Channel>();
  private idleTimer: NodeJS.Timeout | undefined;
  private closed = false;
  // Stops waiting for the client's 'end' (shared with the other Wakeups on the client; see onNext).
  private readonly stopWaitingForEnd: () => void;
  // While the user's client is between connections: stops waiting for its next 'close', or the check below.
  private stopWatchingClose: (() => void) | undefined;
  private closeCheck: NodeJS.Timeout | undefined;
  // A new copy's subscriptions after one ended on its own (see lost), and the delay before them.
  private renewTimer: NodeJS.Timeout | undefined;
  private renewDelay = 0;
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
    this.watchClose();
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
    state.ready ??= subscribeWithin(sub, channel, timeout);
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
    this.stopWatchingClose?.();
    if (this.closeCheck) clearInterval(this.closeCheck);
    if (this.renewTimer) clearTimeout(this.renewTimer);
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

  /**
   * A client quit or disconnected while it is reconnecting emits no 'end' (ioredis has no connection left to close):
   * after each 'close' of the user's client, check until it is ready again whether the user closed it meanwhile.
   */
  private watchClose(): void {
    if (this.closed) return;
    this.stopWatchingClose = onNext(this.client, 'close', () => {
      this.stopWatchingClose = undefined;
      if (this.closed) return;
      this.closeCheck = setInterval(() => {
        if (closedByUser(this.client)) this.close();
        else if (this.client.status === 'ready') {
          clearInterval(this.closeCheck);
          this.closeCheck = undefined;
          this.watchClose();
        }
      }, 100);
      this.closeCheck.unref();
    });
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
    sub.on('end', () => this.lost(sub));
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
              if (closedByUser(client)) {
                this.close();
                return null;
              }
              return retry(times);
            },
    };
  }

  /**
   * The copy ended on its own (ours unset `subscriber` first): its retryStrategy, the user's, gave up, say after Redis
   * dropped it past the pub/sub output buffer limit, while the user's client may well be up. Its subscriptions are gone,
   * and its channels' waiters, subscribed as far as they know, would sleep a second between attempts for good: subscribe
   * them again on a new copy, backing off while copies keep ending (Redis at maxclients, say).
   */
  private lost(sub: RedisClient): void {
    if (this.subscriber !== sub) return;
    this.subscriber = undefined;
    for (const ch of this.channels.values()) ch.ready = undefined;
    if (this.channels.size === 0 || this.renewTimer !== undefined) return;
    this.renewDelay = backoff(this.renewDelay, RENEW_MIN_MS, RENEW_MAX_MS);
    this.renewTimer = setTimeout(() => this.renew(), this.renewDelay);
    this.renewTimer.unref();
  }

  /** Subscribes the channels that lost their subscription on a new copy, then wakes their listeners (see lost). */
  private renew(): void {
    this.renewTimer = undefined;
    if (this.closed || this.channels.size === 0) return;
    if (closedByUser(this.client)) return this.close();
    const sub = this.connection();
    for (const [name, ch] of this.channels) {
      if (ch.ready !== undefined) continue;
      const ready = subscribeWithin(sub, name, this.timeout);
      ch.ready = ready;
      // A release published while it was not subscribed was not heard: its waiters look now ('' = anyone may try).
      const wake = () => {
        for (const listener of [...ch.listeners]) listener('');
      };
      ready.then(
        () => {
          this.renewDelay = 0;
          wake();
        },
        () => {
          if (ch.ready === ready) ch.ready = undefined;
          wake();
        },
      );
    }
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

/**
 * SUBSCRIBEs `channel` once the subscriber connection is ready, failing after `timeout` ms. Not through bounded(), which
 * fails at once while a connection reconnects: ours reconnects by itself within moments (Redis dropped it, say), and a
 * waiter whose subscription failed does not ask again, but polls every 50 ms for the rest of its wait.
 */
function subscribeWithin(sub: RedisClient, channel: string, timeout: number): Promise<unknown> {
  return new Promise((resolve, reject) => {
    // The bound covers the reply too: a connection that is ready but does not answer (a paused Redis, a half-open
    // socket) must not keep the channel's subscription, and every waiter's listener, pending for good.
    const send = (): void => {
      sub.subscribe(channel).then(
        (reply) => {
          clearTimeout(timer);
          resolve(reply);
        },
        (error: unknown) => {
          clearTimeout(timer);
          reject(error);
        },
      );
    };
    // Given up: no SUBSCRIBE once the connection is back (its channel may be gone by then), and nothing kept meanwhile.
    const timer = setTimeout(() => {
      stopWaiting();
      reject(new RedisCallError(`Redis did not confirm the subscription within ${timeout} ms`));
    }, timeout);
    timer.unref();
    const stopWaiting = onReady(sub, send);
  });
}

/** Whether the user closed `client` (quit() or disconnect(), done or under way): nothing may reconnect for it then. */
function closedByUser(client: RedisClient): boolean {
  // ioredis sets manuallyClosing on quit() and disconnect(), and clears it only when a connection closes.
  return (client as unknown as { manuallyClosing?: unknown }).manuallyClosing === true || client.status === 'end';
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
    private wakeups: Wakeups,
    private readonly timeout: number,
  ) {}

  /**
   * A share of `client`'s Wakeups, made on first use (and again after the client ended); this share's subscriptions
   * give up after `timeout` ms.
   */
  static of(client: RedisClient, timeout: number): WakeupShare {
    return new WakeupShare(client, WakeupShare.current(client, timeout), timeout);
  }

  private static current(client: RedisClient, timeout: number): Wakeups {
    let entry = shared.get(client);
    if (entry === undefined || entry.wakeups.isClosed) {
      entry = { wakeups: new Wakeups(client, timeout), users: 0 };
      shared.set(client, entry);
    }
    entry.users++;
    return entry.wakeups;
  }

  /** See {@link Wakeups.listen}. */
  async listen(name: string, listener: Listener): Promise<() => void> {
    if (this.closed) throw new Error('wake-ups closed');
    if (this.wakeups.isClosed && !closedByUser(this.client)) {
      // Its client was connected again after it ended, or the subscriber copy gave up: use the client's current ones.
      this.wakeups = WakeupShare.current(this.client, this.timeout);
    }
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

// The callbacks waiting for each subscriber connection's next 'ready', called by one listener per connection, not one
// per channel, which would pile up (and trip Node's MaxListenersExceededWarning) while a connection that is down keeps
// timing subscriptions out. A callback that gave up is taken out, so the waits of a connection that stays down do not
// accumulate.
const readyWaits = new WeakMap<RedisClient, Set<() => void>>();

/** Calls `callback` once `client` is ready for commands (now, if it is); returns how to stop waiting. */
function onReady(client: RedisClient, callback: () => void): () => void {
  if (client.status === 'ready') {
    callback();
    return () => undefined;
  }
  let waiting = readyWaits.get(client);
  if (waiting === undefined) {
    const callbacks = new Set<() => void>();
    waiting = callbacks;
    readyWaits.set(client, callbacks);
    client.once('ready', () => {
      readyWaits.delete(client);
      for (const f of callbacks) f();
    });
  }
  waiting.add(callback);
  const set = waiting;
  return () => set.delete(callback);
}
