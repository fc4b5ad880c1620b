// Caches and memories of recent events that must not grow without bound: a Map or Set in insertion order, the oldest
// entry dropped to make room.

/** Drops the oldest entry of `entries` when it holds `max` or more, so that one more fits. */
export function makeRoom<K>(entries: Map<K, unknown> | Set<K>, max: number): void {
  if (entries.size >= max) entries.delete(entries.keys().next().value as K);
}
