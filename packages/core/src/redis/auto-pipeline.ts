// Writes the commands we send on one connection within one tick as a single socket write (one syscall on our side, one
// read on the server's) instead of one write per command. Only the socket's own write buffering is used, for the rest
// of the tick: the client's options, commands and replies are untouched.

/** The part of a Node socket we use. */
interface Corkable {
  cork(): void;
  uncork(): void;
}

// Sockets corked until the end of the current tick.
const corked = new WeakSet<object>();

/**
 * Makes the writes on `client`'s current socket until the end of this tick go out together. A no-op on clients
 * without a single socket (Cluster: each node has its own; a command's node is only known inside ioredis) and on
 * connections that are not ready (commands then wait in ioredis's offline queue, which bounded() refuses anyway).
 */
export function batchWrites(client: object): void {
  const { stream, status } = client as { stream?: Partial<Corkable>; status?: string };
  if (status !== 'ready' || stream === undefined || typeof stream.cork !== 'function' || corked.has(stream)) return;
  const socket = stream as Corkable;
  corked.add(socket);
  socket.cork();
  // Replies settle as promises: a nextTick queued from promise callbacks runs once they have all run, so every command a
  // batch of replies leads to joins the write. Uncorked exactly once, even if the socket closed meanwhile.
  process.nextTick(uncork, socket);
}

function uncork(socket: Corkable): void {
  corked.delete(socket);
  socket.uncork();
}
