// Express has no "handler finished" hook: a handler is done when it ends its response. This wraps the response's own
// end() (not 'finish', which never fires once the client has gone) so the locks of the request are released exactly
// when the handler, an error handler or Express's final handler ends the response. A response can also close without
// being ended, and then who closed it decides:
// - this process (Express answering an error after the headers were sent by destroying the connection, a stream piped
//   into the response that failed, a handler that destroyed it): whoever could still end it has given up, so the locks
//   go at once;
// - the client (it disconnected) or a socket timeout: the handler may still be running, and holds the lock until it ends
//   the response, which works on a closed connection; a handler that gives up on the gone client without ending it
//   frees the locks when the response object is garbage-collected (nothing can end it any more, so its handler is done).
import { onConnectionClose, type HeldLock } from '@hasp/core/http';
import type { ServerResponse } from 'node:http';
import type { Socket } from 'node:net';

const HELD = Symbol('hasp.heldLocks');
const END = Symbol('hasp.originalEnd');
const SOCKET = Symbol('hasp.socket');

type Tracked = ServerResponse & { [HELD]?: HeldLock[] | undefined; [END]?: ServerResponse['end']; [SOCKET]?: Socket | null };

// Holds only the list of locks, never the response: a registered response stays collectable.
const abandoned = new FinalizationRegistry<HeldLock[]>(releaseAll);

function releaseAll(list: HeldLock[]): void {
  for (const held of list) held.release();
}

/** Releases `held` when `res` is ended (or closed by this process, or collected unended); one wrapper per response. */
export function releaseOnEnd(res: ServerResponse, held: HeldLock): void {
  const r = res as Tracked;
  const list = r[HELD];
  if (list !== undefined) {
    list.push(held);
    return;
  }
  r[HELD] = [held];
  r[END] = r.end;
  r.end = endAndRelease as ServerResponse['end'];
  // The response's socket stays reachable from it only until it closes; kept to see who closed it.
  r[SOCKET] = res.socket;
  // Closed before the lock was held (the client left while an earlier middleware or the acquire ran): 'close' has
  // fired already.
  if (res.destroyed) closedUnended.call(r);
  // 'close' fires once per response, after the end or when the connection goes: cheaper than registering every response.
  else res.on('close', closedUnended);
  // A pipelined request's response waits for the one ahead of it on the connection before it gets the socket, and if
  // the connection goes meanwhile it never closes: registered now, its locks go once nothing can end it (a response
  // still in use is not collected, and a release after the end does nothing).
  if (res.socket == null) {
    abandoned.register(r, r[HELD]);
    // Until its turn, this process closing it shows only on its own destroy() (its 'close' waits for the turn: a
    // failed pipe into it) and on the connection's close (it never closes if the connection goes first: a
    // closeAllConnections(), Express answering the error of a response ahead of it): its locks go at once then, as
    // for a response that had its socket from the start. Its turn may still come: the socket it gets then tells.
    const destroy = res.destroy;
    r.destroy = function destroyQueued(this: Tracked, error?: Error) {
      if (this.socket == null) releaseNow(this);
      return destroy.call(this, error);
    } as ServerResponse['destroy'];
    const connection = (res as { req?: { socket?: Socket | null } }).req?.socket;
    const unwatch =
      connection == null
        ? undefined
        : onConnectionClose(connection, () => {
            if (r.socket == null && closedHere(connection)) releaseNow(r);
          });
    res.once('socket', (socket: Socket) => {
      r[SOCKET] = socket;
      unwatch?.();
    });
  }
}

/** Releases the locks of `r` now, if it still has them. */
function releaseNow(r: Tracked): void {
  const list = r[HELD];
  if (list === undefined) return;
  r[HELD] = undefined;
  releaseAll(list);
}

/** On 'close': nothing to do after the end; otherwise the locks go now, or once the response is collected. */
function closedUnended(this: Tracked): void {
  const list = this[HELD];
  if (list === undefined) return;
  if (closedHere(this[SOCKET])) {
    releaseNow(this);
    return;
  }
  abandoned.register(this, list);
}

/**
 * Whether code in this process closed the connection (Express's final handler destroys it to answer an error after
 * the headers were sent; a failed pipe into the response destroys it with the source's error): the peer had not ended
 * it, it did not fail on the network or in Node's HTTP parser, and no socket timeout was armed (a server timeout
 * destroys the connection under a handler that is still running). When unsure, no.
 */
function closedHere(socket: Socket | null | undefined): boolean {
  if (socket == null || socket.readableEnded || Number(socket.timeout) > 0) return false;
  const error = socket.errored as (Error & { syscall?: unknown; code?: unknown }) | null;
  return error == null || !(error.syscall !== undefined || (typeof error.code === 'string' && PEER_CODES.test(error.code)));
}

// Errors of the connection itself rather than of code using it (a read or write that failed carries its syscall too).
const PEER_CODES = /^(?:ECONNRESET|EPIPE|ECONNABORTED|ETIMEDOUT|HPE_.*|ERR_HTTP_REQUEST_TIMEOUT)$/;

function endAndRelease(this: Tracked, ...args: unknown[]): unknown {
  const list = this[HELD];
  if (list !== undefined) {
    this[HELD] = undefined;
    // Released before the response is written: the release command goes to Redis first (see HeldLock.release), ahead
    // of any request the client sends next.
    releaseAll(list);
  }
  return (this[END] as (...a: unknown[]) => unknown).apply(this, args);
}
