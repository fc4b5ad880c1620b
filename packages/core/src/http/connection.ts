// A pipelined HTTP/1.1 request's response waits for the ones ahead of it before it gets its socket, and never emits
// 'close' if the connection goes before its turn: code waiting on such a response watches the connection instead.
import { sharedWatcher } from '../util/abort.js';

/** An emitter of 'close' that says whether it has closed (a response, a socket). */
export interface Closable {
  readonly destroyed: boolean;
  once(event: 'close', listener: () => void): unknown;
  off(event: 'close', listener: () => void): unknown;
}

// One 'close' listener per connection however many of its requests watch it: a listener each went past Node's default
// of ten and printed MaxListenersExceededWarning for ten requests queued on one keep-alive connection.
/** Calls `fn` once `connection` closes; returns what stops watching (call it when the response closed first). */
export const onConnectionClose: (connection: Closable, fn: () => void) => () => void = sharedWatcher<Closable>(
  (connection, listener) => connection.once('close', listener),
  (connection, listener) => connection.off('close', listener),
);
