// Bounds every Redis round trip in time, so an unreachable Redis becomes a typed error within `timeout` ms
// instead of waiting out ioredis's offline queue and retry budget.
import type { RedisClient } from '../types.js';

/** Thrown (internally, then wrapped by the caller into its typed error) when Redis is down or too slow. */
export class RedisCallError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'RedisCallError';
  }
}

// ioredis states in which a command would sit in the offline queue or fail anyway: answer at once instead.
const DOWN = new Set(['end', 'close', 'reconnecting']);

/**
 * Runs `op` against `client`, failing fast while the client is reconnecting and after `timeout` ms otherwise.
 * When the operation completes after the caller gave up, `late` receives its result so side effects can be undone.
 */
export function bounded<T>(
  client: RedisClient,
  timeout: number,
  op: () => Promise<T>,
  late?: (result: T) => void,
): Promise<T> {
  const { status, retryAttempts, manuallyClosing } = client as unknown as {
    status?: string;
    retryAttempts?: unknown;
    manuallyClosing?: unknown;
  };
  if (status !== undefined && DOWN.has(status)) {
    return Promise.reject(new RedisCallError(`Redis connection is ${status}`));
  }
  // After the user's quit() the server closes the socket: a command written then fails with EPIPE, and the close
  // that follows rejects the user's own QUIT with "Connection is closed" if its reply was not read yet.
  if (manuallyClosing === true) return Promise.reject(new RedisCallError('Redis connection is closing'));
  // Between reconnect attempts ioredis passes through 'connecting' and 'connect'; a command sent then would wait in the
  // offline queue and run whenever the server is back, long after we gave up on it. A client that has connected
  // before counts its attempts (reset once ready).
  if (status !== 'ready' && typeof retryAttempts === 'number' && retryAttempts > 0) {
    return Promise.reject(new RedisCallError(`Redis connection is reconnecting (attempt ${retryAttempts})`));
  }
  let pending: Promise<T>;
  try {
    pending = op();
  } catch (error) {
    return Promise.reject(error);
  }
  return new Promise<T>((resolve, reject) => {
    let done = false;
    const timer = setTimeout(() => {
      done = true;
      reject(new RedisCallError(`Redis did not answer within ${timeout} ms`));
    }, timeout);
    timer.unref();
    pending.then(
      (value) => {
        if (done) {
          late?.(value);
          return;
        }
        done = true;
        clearTimeout(timer);
        resolve(value);
      },
      (error: unknown) => {
        if (done) return;
        done = true;
        clearTimeout(timer);
        reject(error);
      },
    );
  });
}
