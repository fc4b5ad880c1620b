// One 'abort' listener per signal, however many calls wait on it. An app often passes one long-lived signal (its
// shutdown) to every acquire: a listener each would pass Node's limit of 10 listeners per event target at the eleventh
// concurrent waiter and print a MaxListenersExceededWarning, which reads like a leak. The listener goes when the last
// call stops watching: Node keeps a composite or timeout signal (AbortSignal.any, AbortSignal.timeout) alive for as
// long as it has an 'abort' listener.

/** Calls `onAbort` once when `signal` aborts, unless the returned function is called first. */
export const watchAbort: (signal: AbortSignal, onAbort: () => void) => () => void = sharedWatcher<AbortSignal>(
  (signal, listener) => signal.addEventListener('abort', listener, { once: true }),
  (signal, listener) => signal.removeEventListener('abort', listener),
);

interface Watch {
  readonly callbacks: Set<() => void>;
  readonly listener: () => void;
}

/**
 * A watcher of one event that fires once on a kind of source (a signal's abort, a connection's close), giving each
 * source one listener however many callers watch it (`add` and `remove` attach and detach it); the listener goes when
 * the last caller stops watching. Returns what starts watching a source, which returns what stops.
 */
export function sharedWatcher<T extends object>(
  add: (source: T, listener: () => void) => void,
  remove: (source: T, listener: () => void) => void,
): (source: T, callback: () => void) => () => void {
  const watches = new WeakMap<T, Watch>();
  return (source, callback) => {
    let watch = watches.get(source);
    if (watch === undefined) {
      const callbacks = new Set<() => void>();
      const listener = () => {
        watches.delete(source);
        for (const c of callbacks) c();
        callbacks.clear();
      };
      watch = { callbacks, listener };
      watches.set(source, watch);
      add(source, listener);
    }
    const { callbacks, listener } = watch;
    callbacks.add(callback);
    return () => {
      if (!callbacks.delete(callback) || callbacks.size > 0) return;
      remove(source, listener);
      if (watches.get(source)?.listener === listener) watches.delete(source);
    };
  };
}

/**
 * Drops the failure of what a user's hook returned, when it is a promise (an `async` hook): its rejection would
 * otherwise be unhandled, which ends the process under Node's default `--unhandled-rejections=throw`, as a throwing
 * hook would if its throw were not caught.
 */
export function ignoreRejection(value: unknown): void {
  if (typeof (value as PromiseLike<unknown> | null)?.then === 'function') (value as PromiseLike<unknown>).then(undefined, () => undefined);
}
