// A pipelined HTTP/1.1 request's response waits for the ones ahead of it before it gets its socket, and never emits
// 'close' if the connection goes before its turn: code waiting on such a response watches the connection instead.

/** An emitter of 'close' that says whether it has closed (a response, a socket). */
export interface Closable {
  readonly destroyed: boolean;
  once(event: 'close', listener: () => void): unknown;
  off(event: 'close', listener: () => void): unknown;
}

interface Watch {
  readonly fns: Set<() => void>;
  readonly fire: () => void;
}

// One 'close' listener per connection however many of its requests watch it: a listener each went past Node's default
// of ten and printed MaxListenersExceededWarning for ten requests queued on one keep-alive connection.
const watches = new WeakMap<Closable, Watch>();

/** Calls `fn` once `connection` closes; returns what stops watching (call it when the response closed first). */
export function onConnectionClose(connection: Closable, fn: () => void): () => void {
  let watch = watches.get(connection);
  if (watch === undefined) {
    const fns = new Set<() => void>();
    const fire = (): void => {
      watches.delete(connection);
      for (const f of fns) f();
    };
    watch = { fns, fire };
    watches.set(connection, watch);
    connection.once('close', fire);
  }
  const { fns, fire } = watch;
  fns.add(fn);
  return () => {
    fns.delete(fn);
    if (fns.size === 0 && watches.get(connection) === watch) {
      watches.delete(connection);
      connection.off('close', fire);
    }
  };
}
