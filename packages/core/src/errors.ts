// The error hierarchy: every error hasp throws at runtime extends HaspError and carries a stable `code`.

/** Where each of hasp's error classes keeps its name in words (see HaspError's constructor). */
const NAME = Symbol.for('hasp.errorName');

/** Stable machine-readable codes carried by every {@link HaspError}. */
export type HaspErrorCode = 'LOCK_BUSY' | 'LOCK_UNAVAILABLE' | 'LOCK_LOST' | 'RATE_LIMIT_UNAVAILABLE';

/**
 * Base class of every runtime error hasp throws. Branch on {@link HaspError.code}, not on the message.
 */
export class HaspError extends Error {
  /** Stable code; see the table in the package README. */
  readonly code: HaspErrorCode;

  constructor(code: HaspErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options?.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
    // hasp's own errors carry their name in words on their prototype (a minifier renames classes; naming the class inside
    // its own body makes bundlers rename it `_LockBusyError`); a subclass of yours is named by its class.
    const own = Object.getOwnPropertyDescriptor(new.target.prototype, NAME) as { value?: unknown } | undefined;
    this.name = typeof own?.value === 'string' ? own.value : new.target.name;
  }
}

/**
 * The key is held by someone else and stayed held for the whole `wait`.
 * `retryAfter` is the holder's remaining time in ms when the store reported it.
 */
export class LockBusyError extends HaspError {
  /** Always `'LOCK_BUSY'`, so that `instanceof` narrows the code too. */
  declare readonly code: 'LOCK_BUSY';
  /** Milliseconds until the current holder's lease runs out, when known. */
  readonly retryAfter: number | undefined;
  /** The key that was busy. */
  readonly key: string;

  constructor(key: string, retryAfter?: number) {
    super('LOCK_BUSY', `lock "${truncate(key)}" is held by another owner`);
    this.key = key;
    this.retryAfter = retryAfter;
  }
}

/**
 * The lock store could not answer: Redis unreachable, a script error, a timeout, or (Redlock) no quorum.
 * The underlying error is kept in `cause`.
 */
export class LockUnavailableError extends HaspError {
  /** Always `'LOCK_UNAVAILABLE'`, so that `instanceof` narrows the code too. */
  declare readonly code: 'LOCK_UNAVAILABLE';
  /** The key of the lock concerned, when the failure concerns one (hasp's own errors always name it). */
  readonly key: string | undefined;

  constructor(message: string, options?: { cause?: unknown; key?: string }) {
    super('LOCK_UNAVAILABLE', message, options);
    this.key = options?.key;
  }
}

/** A {@link LockUnavailableError} for a lock operation on `key`: `lock <what> failed for "<key>": <reason>`. */
export function lockFailed(what: string, key: string, reason: string, cause?: unknown): LockUnavailableError {
  return new LockUnavailableError(`lock ${what} failed for "${truncate(key)}": ${reason}`, cause === undefined ? { key } : { cause, key });
}

/** `error` as a hasp error: itself when it is one, otherwise a {@link lockFailed} for `key` that keeps it as cause. */
export function asLockError(what: string, key: string, error: unknown): HaspError {
  return error instanceof HaspError ? error : lockFailed(what, key, String((error as Error | null)?.message ?? error), error);
}

/**
 * The error of an acquire whose grant came too late to be of use: `took` ms, against a `ttl` less the `drift` allowed.
 * With a ttl of a few ms the drift allowance is most of it, which the message says, or "took 1 ms" reads as a slow Redis.
 */
export function grantTooLate(key: string, took: number, ttl: number, drift: number): LockUnavailableError {
  const why = drift > 0 ? `, which with the ${drift} ms allowed for clock drift leaves nothing of the ${ttl} ms ttl` : `, longer than the ${ttl} ms ttl`;
  return lockFailed('acquire', key, `it took ${Math.round(took)} ms${why}: the lease would have ended`);
}

/** The lease is no longer held (expired, released, or taken over), so it cannot be extended. */
export class LockLostError extends HaspError {
  /** Always `'LOCK_LOST'`, so that `instanceof` narrows the code too. */
  declare readonly code: 'LOCK_LOST';
  /** The key whose lease was lost. */
  readonly key: string;

  constructor(key: string, message?: string, options?: { cause?: unknown }) {
    super('LOCK_LOST', message ?? `lock "${truncate(key)}" is no longer held`, options);
    this.key = key;
  }
}

/**
 * Redis could not answer a token-bucket call: `TokenBucket.take`, `peek` and `reset` reject with it on any Redis failure
 * (an error reply, a lost or closed connection, no answer within the bucket's `timeout`); `cause` holds the underlying
 * error. The rate-limit middleware catches it and applies `onStoreError`; under `'closed'` the client gets a 503 with
 * the same code, `RATE_LIMIT_UNAVAILABLE`.
 */
export class RateLimitUnavailableError extends HaspError {
  /** Always `'RATE_LIMIT_UNAVAILABLE'`, so that `instanceof` narrows the code too. */
  declare readonly code: 'RATE_LIMIT_UNAVAILABLE';

  constructor(message: string, options?: { cause?: unknown }) {
    super('RATE_LIMIT_UNAVAILABLE', message, options);
  }
}

for (const [cls, name] of [
  [HaspError, 'HaspError'],
  [LockBusyError, 'LockBusyError'],
  [LockUnavailableError, 'LockUnavailableError'],
  [LockLostError, 'LockLostError'],
  [RateLimitUnavailableError, 'RateLimitUnavailableError'],
] as const) {
  Object.defineProperty(cls.prototype, NAME, { value: name });
}

// Keys may be megabytes long; error messages should stay readable.
function truncate(key: string): string {
  return key.length > 64 ? `${key.slice(0, 61)}...` : key;
}
