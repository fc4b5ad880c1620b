// One listener per client and event for all of hasp's interest in it. A listener per locker or per rate limiter would
// trip Node's MaxListenersExceededWarning on the user's client in an app with more than ten of them on one client.

/** The part of an ioredis client (or any EventEmitter) this needs. */
export interface EventSource {
  once(event: string, listener: () => void): unknown;
  off(event: string, listener: () => void): unknown;
}

interface Waiting {
  readonly callbacks: Set<() => void>;
  readonly fire: () => void;
}

const waiting = new WeakMap<EventSource, Map<string, Waiting>>();

/**
 * Calls `callback` once, at the next `event` of `source`, through a listener shared with every other callback waiting
 * for that event. Returns a function that stops waiting (and removes the shared listener when nobody waits any more).
 */
export function onNext(source: EventSource, event: string, callback: () => void): () => void {
  let events = waiting.get(source);
  if (events === undefined) {
    events = new Map();
    waiting.set(source, events);
  }
  const byEvent = events;
  let entry = byEvent.get(event);
  if (entry === undefined) {
    const callbacks = new Set<() => void>();
    const fire = (): void => {
      if (byEvent.get(event)?.callbacks === callbacks) byEvent.delete(event);
      for (const call of callbacks) call();
    };
    entry = { callbacks, fire };
    byEvent.set(event, entry);
    source.once(event, fire);
  }
  const mine = entry;
  mine.callbacks.add(callback);
  return () => {
    if (!mine.callbacks.delete(callback) || mine.callbacks.size > 0 || byEvent.get(event) !== mine) return;
    byEvent.delete(event);
    source.off(event, mine.fire);
  };
}
