// Express has no "handler finished" hook: a handler is done when it ends its response. This wraps the response's own
// end() (not 'finish', which never fires once the client has gone; not 'close', which fires on a disconnect while the
// handler still runs) so the locks of the request are released exactly when the handler, an error handler or Express's
// final handler ends the response.
import type { HeldLock } from '@hasp/core/http';
import type { ServerResponse } from 'node:http';

const HELD = Symbol('hasp.heldLocks');
const END = Symbol('hasp.originalEnd');

type Tracked = ServerResponse & { [HELD]?: HeldLock[] | undefined; [END]?: ServerResponse['end'] };

/** Releases `held` when `res` is ended; one wrapper per response, however many locks it holds. */
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
}

function endAndRelease(this: Tracked, ...args: unknown[]): unknown {
  const list = this[HELD];
  if (list !== undefined) {
    this[HELD] = undefined;
    // Released before the response goes out: the release reaches Redis ahead of any request the client sends next.
    for (const held of list) held.release();
  }
  return (this[END] as (...a: unknown[]) => unknown).apply(this, args);
}
