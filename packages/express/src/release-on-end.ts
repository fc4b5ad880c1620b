// Express has no "handler finished" hook: a handler is done when it ends its response. This wraps the response's own
// end() (not 'finish', which never fires once the client has gone) so the locks of the request are released exactly
// when the handler, an error handler or Express's final handler ends the response; and its destroy(), by which code in
// this process gives the response up (a stream piped into it that failed, a handler that destroyed it): the locks go at
// once then, whether or not the response had its socket yet (a pipelined request's response waits for the ones ahead
// of it). A response that closes unended any other way keeps them: the client left, a socket timeout fired, or the
// connection was closed under it (Express answering an error after the headers were sent, closeAllConnections(), a
// client's CONNECT, which Node answers by destroying the socket as this process would), and in each case its handler
// may still be running and end it, which works on a closed connection. A handler that gives up without ending it frees
// the locks when the response object is garbage-collected: nothing can end it any more.
// A middleware after withLock may put its own end() over the wrapped one and call the one under it only later: after
// work of its own that the lock still covers (express-session saves the session first), or, once the client has gone,
// never (compression() waits for its zlib stream to drain). So every end() set on the response afterwards is wrapped
// as well, to note that the handler asked for the end: the locks then go with the end under it, or at once if the
// response is closed (by then, or when it closes), since on a closed response that end may never come.
import { onConnectionClose, type HeldLock } from '@hasp/core/http';
import type { ServerResponse } from 'node:http';

const HELD = Symbol('hasp.heldLocks');
const END = Symbol('hasp.originalEnd');
const DESTROY = Symbol('hasp.originalDestroy');
const GIVEN_UP = Symbol('hasp.givenUp');
/** The end() a later middleware set on the response, wrapped (see setEnd). */
const OUTER_END = Symbol('hasp.outerEnd');
/** Marks the wrappers setEnd makes. */
const RELEASES = Symbol('hasp.releases');
/** An end() set by a later middleware was called. */
const END_ASKED = Symbol('hasp.endAsked');

type Tracked = ServerResponse & {
  [HELD]?: HeldLock[] | undefined;
  [END]?: ServerResponse['end'];
  [DESTROY]?: ServerResponse['destroy'];
  /** This process destroyed the request while its connection was open (a rejected upload). */
  [GIVEN_UP]?: boolean;
  [OUTER_END]?: ServerResponse['end'] | undefined;
  [END_ASKED]?: boolean;
};

type End = ((...args: unknown[]) => unknown) & { [RELEASES]?: true };

type Request = { socket?: { destroyed?: boolean } | null; readableEnded?: boolean; destroy(...args: unknown[]): unknown };
type Closable = Parameters<typeof onConnectionClose>[0];

// Holds only the list of locks, never the response: a registered response stays collectable. (A release after the end
// does nothing: HeldLock.release acts once.)
const abandoned = new FinalizationRegistry<HeldLock[]>(releaseAll);

function releaseAll(list: HeldLock[]): void {
  for (const held of list) held.release();
}

/** Releases `held` when `res` is ended or destroyed, or collected unended; wraps each response once. */
export function releaseOnEnd(res: ServerResponse, held: HeldLock): void {
  const r = res as Tracked;
  if (r[END] !== undefined) {
    // Wrapped for an earlier withLock of this request: its locks are still held, or they went with the response (ended
    // or destroyed), and so does this one.
    const list = r[HELD];
    if (list !== undefined) list.push(held);
    else held.release();
    return;
  }
  const list = [held];
  r[HELD] = list;
  r[END] = r.end;
  Object.defineProperty(r, 'end', END_PROPERTY);
  r[DESTROY] = r.destroy;
  r.destroy = destroyAndRelease as ServerResponse['destroy'];
  // A handler that rejects an upload destroys the request, which destroys the connection at once, and then the
  // response: that is this process giving the response up, though the connection is gone by the response's destroy().
  // (Node destroys a request itself only once its connection is gone.)
  const req = (res as { req?: Request }).req;
  if (req !== undefined && typeof req.destroy === 'function') {
    const destroyRequest = req.destroy;
    req.destroy = function destroyRequestHere(this: Request, ...args: unknown[]): unknown {
      // Not the destroy a request's stream makes of itself once its body has been read to the end (autoDestroy).
      if (this.socket != null && this.socket.destroyed !== true && this.readableEnded !== true) r[GIVEN_UP] = true;
      return destroyRequest.apply(this, args);
    };
  }
  // Closed already (the client left while an earlier middleware or the acquire ran), or queued behind another response
  // on its connection, which it never closes if the connection goes before its turn: registered now. Otherwise at
  // 'close', which fires once per response, after the end or when the connection goes (a queued one's once its turn
  // came): cheaper than registering every response.
  if (res.destroyed || res.socket == null) abandoned.register(r, list);
  r.once('close', closedUnended);
}

/**
 * On 'close' (the response is destroyed by then): nothing to do after the end; after an end() asked for through a
 * later middleware, the locks go now; otherwise once the response is collected.
 */
function closedUnended(this: Tracked): void {
  if (this[END_ASKED] === true) releaseHeld(this);
  const list = this[HELD];
  if (list !== undefined) abandoned.register(this, list);
}

/** Takes the response's locks off it and releases them. */
function releaseHeld(r: Tracked): void {
  const list = r[HELD];
  if (list === undefined) return;
  r[HELD] = undefined;
  releaseAll(list);
}

// Shared by every wrapped response: the state is on the response, so wrapping one makes no closures.
const END_PROPERTY: PropertyDescriptor = { get: getEnd, set: setEnd, enumerable: true, configurable: true };

function getEnd(this: Tracked): unknown {
  return this[OUTER_END] ?? endAndRelease;
}

function setEnd(this: Tracked, end: unknown): void {
  if (typeof end !== 'function' || end === endAndRelease) {
    // Put back (a middleware undoing its wrap), or not a function at all: served as it was set.
    this[OUTER_END] = end === endAndRelease ? undefined : (end as ServerResponse['end']);
    return;
  }
  const f = end as End;
  if (f[RELEASES] === true) {
    this[OUTER_END] = f as unknown as ServerResponse['end'];
    return;
  }
  const wrapped = askingEnd(this, f);
  wrapped[RELEASES] = true;
  this[OUTER_END] = wrapped as unknown as ServerResponse['end'];
}

/**
 * Calls the later middleware's end() itself, not the one before it: that one it calls when it is ready (it got it from
 * the getter before setting its own). Releases `res`, the response it was set on, not `this`: a middleware may have
 * bound its end() (`res.end.bind(res)`), and the handler call it detached.
 */
function askingEnd(res: Tracked, f: End): End {
  return function endAsked(this: unknown, ...args: unknown[]): unknown {
    if (res[END_ASKED] !== true && res[HELD] !== undefined) {
      res[END_ASKED] = true;
      const connection = (res as { req?: Request }).req?.socket;
      if (res.destroyed || connection?.destroyed === true) releaseHeld(res);
      else if (res.socket == null && connection != null) {
        // Queued behind another response on its connection: its 'close' comes only if it gets its turn, and the
        // connection's if the client goes first.
        const stop = onConnectionClose(connection as Closable, () => releaseHeld(res));
        res.once('close', stop);
      }
    }
    return f.apply(this, args);
  };
}

function endAndRelease(this: Tracked, ...args: unknown[]): unknown {
  // Released before the response is written: the release command goes to Redis first (see HeldLock.release), ahead of
  // any request the client sends next.
  releaseHeld(this);
  return (this[END] as (...a: unknown[]) => unknown).apply(this, args);
}

function destroyAndRelease(this: Tracked, ...args: unknown[]): unknown {
  // Not when the client's leaving set it off: a pipe from the request into a response still waiting for its turn fails
  // once the connection goes, and destroys the response, while the handler may go on (its response closed then).
  if (this[GIVEN_UP] === true || (!this.destroyed && (this as { req?: Request }).req?.socket?.destroyed !== true)) {
    releaseHeld(this);
  }
  return (this[DESTROY] as (...a: unknown[]) => unknown).apply(this, args);
}
