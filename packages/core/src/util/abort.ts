// One 'abort' listener per signal, however many calls wait on it. An app often passes one long-lived signal (its
// shutdown) to every acquire: a listener each would pass Node's limit of 10 listeners per event target at the eleventh
// concurrent waiter and print a MaxListenersExceededWarning, which reads like a leak. The listener goes when the last
// call stops watching: Node keeps a composite or timeout signal (AbortSignal.any, AbortSignal.timeout) alive for as
// long as it has an 'abort' listener.

interface Watch {
  readonly callbacks: Set<() => void>;
  readonly listener: () => void;
}

const watches = new WeakMap<AbortSignal, Watch>();

/** Calls `onAbort` once when `signal` aborts, unless the returned function is called first. */
export function watchAbort(signal: AbortSignal, onAbort: () => void): () => void {
  let watch = watches.get(signal);
  if (watch === undefined) {
    const callbacks = new Set<() => void>();
    const listener = () => {
      watches.delete(signal);
      for (const callback of callbacks) callback();
      callbacks.clear();
    };
    watch = { callbacks, listener };
    watches.set(signal, watch);
    signal.addEventListener('abort', listener, { once: true });
  }
  const { callbacks, listener } = watch;
  callbacks.add(onAbort);
  return () => {
    if (!callbacks.delete(onAbort) || callbacks.size > 0) return;
    signal.removeEventListener('abort', listener);
    if (watches.get(signal)?.listener === listener) watches.delete(signal);
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
