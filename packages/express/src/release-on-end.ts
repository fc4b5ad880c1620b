// Express has no "handler finished" hook: a handler is done when it ends its response. This wraps the response's own
// end() (not 'finish', which never fires once the client has gone; not 'close', which fires on a disconnect while the
// handler still runs) so the locks of the request are released exactly when the handler, an error handler or Express's
// final handler ends the response; and, for a handler that gives up on a disconnected client without ending the
// response, when the response object is garbage-collected (nothing can end it any more, so its handler is done).
import type { HeldLock } from '@hasp/core/http';
import type { ServerResponse } from 'node:http';

const HELD = Symbol('hasp.heldLocks');
const END = Symbol('hasp.originalEnd');

type Tracked = ServerResponse & { [HELD]?: HeldLock[] | undefined; [END]?: ServerResponse['end'] };

// Holds only the list of locks, never the response: a registered response stays collectable.
const abandoned = new FinalizationRegistry<HeldLock[]>(releaseAll);

function releaseAll(list: HeldLock[]): void {
  for (const held of list) held.release();
}

/** Releases `held` when `res` is ended (or collected unended); one wrapper per response, however many locks it holds. */
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
  // 'close' fires once per response, after the end or when the client goes: cheaper than registering every response.
  res.on('close', closedUnended);
}

/** On 'close' before the end (the client went away): from now on, collecting the response releases its locks. */
function closedUnended(this: Tracked): void {
  const list = this[HELD];
  if (list !== undefined) abandoned.register(this, list);
}

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
