// One 'abort' listener per signal, however many calls wait on it. An app often passes one long-lived signal (its
// shutdown) to every acquire: a listener each would pass Node's limit of 10 listeners per event target at the eleventh
// concurrent waiter and print a MaxListenersExceededWarning, which reads like a leak.

const watchers = new WeakMap<AbortSignal, Set<() => void>>();

/** Calls `onAbort` once when `signal` aborts, unless the returned function is called first. */
export function watchAbort(signal: AbortSignal, onAbort: () => void): () => void {
  let callbacks = watchers.get(signal);
  if (callbacks === undefined) {
    const set = new Set<() => void>();
    callbacks = set;
    watchers.set(signal, set);
    // Left on the signal once added (it holds only the set): one per signal, dropped with it.
    signal.addEventListener(
      'abort',
      () => {
        watchers.delete(signal);
        for (const callback of set) callback();
        set.clear();
      },
      { once: true },
    );
  }
  const set = callbacks;
  set.add(onAbort);
  return () => set.delete(onAbort);
}
