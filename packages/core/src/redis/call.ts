// Bounds every Redis round trip in time, so an unreachable Redis becomes a typed error within `timeout` ms
// instead of waiting out ioredis's offline queue and retry budget.
import type { RedisClient } from '../types.js';
import { realPerfNow, realSetTimeout } from '../util/real-timers.js';

/** Thrown (internally, then wrapped by the caller into its typed error) when Redis is down or too slow. */
export class RedisCallError extends Error {
  constructor(
    message: string,
    /** Whether the command was never handed to the connection (it cannot have run). */
    readonly unsent = false,
  ) {
    super(message);
    this.name = 'RedisCallError';
  }
}

// ioredis states in which a command would sit in the offline queue or fail anyway, and how the messages say them:
// answer at once instead.
const DOWN = new Map([
  ['end', 'has ended'],
  ['close', 'is closed'],
  ['reconnecting', 'is reconnecting'],
]);

/**
 * Why a command must not be sent on `client` now (it would fail, or wait in ioredis's offline queue and run long after
 * the caller gave up), or undefined when it may be sent.
 */
export function unavailable(client: RedisClient): RedisCallError | undefined {
  const { status, retryAttempts, manuallyClosing } = client as unknown as {
    status?: string;
    retryAttempts?: unknown;
    manuallyClosing?: unknown;
  };
  if (status === 'ready' && manuallyClosing !== true) return undefined;
  const down = status === undefined ? undefined : DOWN.get(status);
  if (down !== undefined) return new RedisCallError(`Redis connection${to(client)} ${down}`, true);
  // After the user's quit() the server closes the socket: a command written then fails with EPIPE, and the close
  // that follows rejects the user's own QUIT with "Connection is closed" if its reply was not read yet.
  if (manuallyClosing === true) return new RedisCallError(`Redis connection${to(client)} is closing`, true);
  // Between reconnect attempts ioredis passes through 'connecting' and 'connect'; a command sent then would wait in the
  // offline queue and run whenever the server is back, long after we gave up on it. A client that has connected
  // before counts its attempts (reset once ready).
  if (typeof retryAttempts === 'number' && retryAttempts > 0) {
    return new RedisCallError(`Redis connection${to(client)} is reconnecting (attempt ${retryAttempts})`, true);
  }
  return undefined;
}

/**
 * Which Redis `client` connects to (host:port, a socket path, or a Sentinel master's name), for messages about it, so
 * that an operator can tell which Redis failed; undefined for a Cluster or a client whose options say nothing. (Why a
 * connection is down, refused or a wrong password, is the client's own 'error' event: a listener of ours would silence
 * ioredis's "Unhandled error event" output for apps that have none.)
 */
function serverOf(client: RedisClient): string | undefined {
  const c = client as { isCluster?: unknown; options?: { host?: unknown; port?: unknown; path?: unknown; sentinels?: unknown; name?: unknown } };
  const o = c.options;
  if (c.isCluster === true || o === undefined) return undefined;
  if (Array.isArray(o.sentinels) && typeof o.name === 'string') return `master "${o.name}" (Sentinel)`;
  if (typeof o.path === 'string' && o.path !== '') return o.path;
  if (typeof o.host === 'string' && typeof o.port === 'number') return o.host.includes(':') ? `[${o.host}]:${o.port}` : `${o.host}:${o.port}`;
  return undefined;
}

/** ' to <server>' for `client`, or ''. */
function to(client: RedisClient): string {
  const server = serverOf(client);
  return server === undefined ? '' : ` to ${server}`;
}

/**
 * Runs `op` against `client`, failing fast while the client is reconnecting and after `timeout` ms otherwise.
 * When the operation completes after the caller gave up, `late` receives its result so side effects can be undone.
 * `map` turns the reply into the result and `wrap` turns any failure into the caller's error, inside the one promise
 * this returns (a lock cycle runs this twice, and every extra `.then` or `.catch` is one more promise and tick).
 * `unsure` is called when the operation was sent but failed or timed out, so that it may have run, or may still run,
 * with no reply to say so: ioredis's own `commandTimeout` or retry limit, a connection closed with the reply on its way.
 */
export function bounded<T, R = T>(
  client: RedisClient,
  timeout: number,
  op: () => Promise<T>,
  late?: (result: T) => void,
  map?: (result: T) => R,
  wrap?: (error: unknown) => unknown,
  unsure?: () => void,
): Promise<R> {
  const fail = wrap ?? same;
  const down = unavailable(client);
  if (down) return Promise.reject(fail(down));
  let pending: Promise<T>;
  try {
    pending = op();
  } catch (error) {
    return Promise.reject(fail(error));
  }
  return new Promise<R>((resolve, reject) => {
    const entry = watch(timeout, () => {
      unsure?.();
      reject(fail(timedOut(client, timeout)));
    });
    pending.then(
      (value) => {
        if (entry.expired) {
          late?.(value);
          return;
        }
        settle(entry);
        if (map === undefined) {
          resolve(value as unknown as R);
          return;
        }
        try {
          resolve(map(value));
        } catch (error) {
          // A reply that cannot be read (see unexpectedReply): what the command did is not known either.
          unsure?.();
          reject(fail(error));
        }
      },
      (error: unknown) => {
        if (entry.expired) return;
        settle(entry);
        // (A batch whose connection dropped before it went out fails its calls unsent: see script.ts.)
        if (unsure !== undefined && !(error instanceof RedisCallError && error.unsent)) unsure();
        reject(fail(error));
      },
    );
  });
}

function noop(): void {}

function same(error: unknown): unknown {
  return error;
}

function timedOut(client: RedisClient, timeout: number): RedisCallError {
  const server = serverOf(client);
  return new RedisCallError(`Redis${server === undefined ? '' : ` at ${server}`} did not answer within ${timeout} ms`);
}

/** What one client answered in a round of `boundedAll`: undefined while (or if never) it answered in time. */
export type Outcome<T> = { ok: true; value: T } | { ok: false; error: unknown } | undefined;

/**
 * Sends one call to each client at once and collects the answers, like `bounded` for each of them but with one deadline
 * for the whole round and one handler per answer (no promise per client besides the client's own). Resolves with the
 * outcomes so far once `done` says so, or when every client answered or failed; a client that has not answered by
 * `timeout` ms counts as failed. Answers after that go to `late` (by index), so side effects can be undone.
 */
export function boundedAll<T>(
  clients: readonly RedisClient[],
  timeout: number,
  send: (client: RedisClient, index: number) => Promise<unknown>,
  parse: (reply: unknown) => T,
  done: (outcomes: readonly Outcome<T>[]) => boolean,
  late?: (index: number, value: T) => void,
): Promise<Outcome<T>[]> {
  const n = clients.length;
  const outcomes: Outcome<T>[] = new Array<Outcome<T>>(n).fill(undefined);
  let left = n;
  let finished = false;
  let entry: Entry | undefined;
  return new Promise((resolve) => {
    const finish = () => {
      finished = true;
      if (entry !== undefined && !entry.expired) settle(entry);
      resolve(outcomes.slice());
    };
    const check = () => {
      if (!finished && (left === 0 || done(outcomes))) finish();
    };
    const answer = (i: number, reply: unknown) => {
      if (finished) {
        if (late === undefined) return;
        let value: T;
        try {
          value = parse(reply);
        } catch {
          return;
        }
        late(i, value);
        return;
      }
      left--;
      try {
        outcomes[i] = { ok: true, value: parse(reply) };
      } catch (error) {
        outcomes[i] = { ok: false, error };
      }
      check();
    };
    const fail = (i: number, error: unknown) => {
      if (finished) return;
      left--;
      outcomes[i] = { ok: false, error };
      check();
    };
    for (let i = 0; i < n; i++) {
      const client = clients[i]!;
      const down = unavailable(client);
      if (down) {
        left--;
        outcomes[i] = { ok: false, error: down };
        continue;
      }
      let pending: Promise<unknown>;
      try {
        pending = send(client, i);
      } catch (error) {
        left--;
        outcomes[i] = { ok: false, error };
        continue;
      }
      pending.then(
        (reply) => answer(i, reply),
        (error: unknown) => fail(i, error),
      );
    }
    check();
    if (finished) return;
    entry = watch(timeout, () => {
      for (let i = 0; i < n; i++) if (outcomes[i] === undefined) outcomes[i] = { ok: false, error: timedOut(clients[i]!, timeout) };
      finish();
    });
  });
}

// Deadlines without a timer per call: calls with the same timeout expire in the order they started, so each distinct
// timeout keeps a FIFO line of calls and one timer armed for the oldest call still pending. A settled call is only
// flagged (and dropped once it reaches the head), so the hot path does no timer work at all.

interface Entry {
  readonly deadline: number;
  expire: () => void;
  readonly line: Line;
  settled: boolean;
  expired: boolean;
}

interface Line {
  readonly timeout: number;
  entries: Entry[];
  head: number;
  timer: NodeJS.Timeout | undefined;
}

const lines = new Map<number, Line>();

function watch(timeout: number, expire: () => void): Entry {
  let line = lines.get(timeout);
  if (line === undefined) {
    line = { timeout, entries: [], head: 0, timer: undefined };
    lines.set(timeout, line);
  }
  const entry: Entry = { deadline: realPerfNow() + timeout, expire, line, settled: false, expired: false };
  line.entries.push(entry);
  if (line.timer === undefined) arm(line, timeout);
  return entry;
}

function settle(entry: Entry): void {
  entry.settled = true;
  // A settled entry can stay in its line's array for a while (until the entries before it settle, or the array is
  // compacted): drop its callback, which holds the caller's promise and all it references (a whole HTTP request, say),
  // so that none of it outlives the call into the old generation.
  entry.expire = noop;
  const line = entry.line;
  const entries = line.entries;
  while (line.head < entries.length && entries[line.head]!.settled) line.head++;
  if (line.head === entries.length) {
    entries.length = 0;
    line.head = 0;
  } else if (line.head > 1024 && line.head * 2 > entries.length) {
    line.entries = entries.slice(line.head);
    line.head = 0;
  }
}

function arm(line: Line, delay: number): void {
  // Rounded up: a timer may fire up to a millisecond before performance.now() reaches the deadline.
  line.timer = realSetTimeout(sweep, Math.max(1, Math.ceil(delay)), line);
  line.timer.unref();
}

function sweep(line: Line): void {
  line.timer = undefined;
  const now = realPerfNow();
  const entries = line.entries;
  const expired: Entry[] = [];
  while (line.head < entries.length) {
    const entry = entries[line.head]!;
    if (!entry.settled) {
      if (entry.deadline > now) break;
      entry.expired = true;
      expired.push(entry);
    }
    line.head++;
  }
  if (line.head === entries.length) {
    entries.length = 0;
    line.head = 0;
    lines.delete(line.timeout);
  } else {
    if (line.head * 2 > entries.length) {
      line.entries = entries.slice(line.head);
      line.head = 0;
    }
    arm(line, line.entries[line.head]!.deadline - now);
  }
  for (const entry of expired) entry.expire();
}
