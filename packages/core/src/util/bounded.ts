// Caches and memories of recent events that must not grow without bound: a Map or Set in insertion order, the oldest
// entry dropped to make room. And retries that must not come ever faster: a delay that doubles up to a ceiling.

/** Drops the oldest entry of `entries` when it holds `max` or more, so that one more fits. */
export function makeRoom<K>(entries: Map<K, unknown> | Set<K>, max: number): void {
  if (entries.size >= max) entries.delete(entries.keys().next().value as K);
}

/**
 * Delays of a release sent again after it failed: a lease's own (LeaseImpl), an unsure acquire's (RedisLockStore), and
 * Redlock's to the nodes it failed on (RedlockStore).
 */
export const RESEND_FIRST_MS = 100;
export const RESEND_MAX_MS = 1_000;

/** The next delay of a retry: `first` after none (0), then twice the last, at most `max`. */
export function backoff(previous: number, first: number, max: number): number {
  return Math.min(previous * 2 || first, max);
}
