// Writes the commands we send on one connection within one tick as a single socket write (one syscall on our side, one
// read on the server's) instead of one write per command. Only the socket's own write buffering is used, for the rest
// of the tick: the client's options, commands and replies are untouched.
import { realSetImmediate } from '../util/real-timers.js';

/** The part of a Node socket we use. */
interface Corkable {
  cork(): void;
  uncork(): void;
}

// Sockets corked until the end of the current tick, with how many commands each has buffered so far.
const corked = new Map<Corkable, number>();

/**
 * Commands per write at most, per socket corked this turn: enough to save most syscalls, few enough that the server
 * starts before the turn ends. Scaled by the sockets in use because the trade-off differs: on one server, handing it
 * work early matters most (8 beat 16 by 10% in lock cycles/s); spread over five Redlock nodes, each write's syscall
 * and wake-up of a server is the cost, and 16 to 32 per socket did best (8 was 15% slower).
 */
const BATCH_PER_SOCKET = 8;

/**
 * Makes the writes on `client`'s current socket until the end of this tick go out together. A no-op on clients
 * without a single socket (Cluster: each node has its own; a command's node is only known inside ioredis) and on
 * connections that are not ready (commands then wait in ioredis's offline queue, which bounded() refuses anyway).
 * @param calls script calls the command about to be written carries (a merged command carries several)
 */
export function batchWrites(client: object, calls = 1): void {
  const { stream, status } = client as { stream?: Partial<Corkable>; status?: string };
  if (status !== 'ready' || stream === undefined || typeof stream.cork !== 'function') return;
  const socket = stream as Corkable;
  const buffered = corked.get(socket);
  if (buffered === undefined) {
    corked.set(socket, calls);
    socket.cork();
    // Uncork after this turn of the event loop's I/O phase, not after this tick: an HTTP server reads many requests in
    // one turn, and their commands then share one write instead of one write each. Uncorked exactly once, even if the
    // socket closed meanwhile.
    realSetImmediate(uncork, socket);
  } else if (full(buffered)) {
    sendNow(socket, calls);
  } else {
    corked.set(socket, buffered + calls);
  }
}

/**
 * After writing a merged command on `client` (counted by `batchWrites(client, calls)`): sends what this socket holds
 * once it has a write's worth of calls, instead of at the end of the turn.
 */
export function sendIfFull(client: object): void {
  const socket = (client as { stream?: Corkable }).stream;
  if (socket === undefined) return;
  const buffered = corked.get(socket);
  if (buffered !== undefined && full(buffered)) sendNow(socket, 0);
}

/** Whether a corked socket holds a write's worth of calls. */
function full(buffered: number): boolean {
  return buffered >= BATCH_PER_SOCKET * corked.size;
}

/**
 * Sends what the socket holds so the server starts on it while we prepare the rest (a whole turn in one write would
 * leave the server idle while the client works, then the client idle while the server works), and keeps it corked for
 * the rest of the turn, holding `calls` calls.
 */
function sendNow(socket: Corkable, calls: number): void {
  socket.uncork();
  socket.cork();
  corked.set(socket, calls);
}

function uncork(socket: Corkable): void {
  corked.delete(socket);
  socket.uncork();
}

/**
 * Writes what `client`'s socket holds now instead of at the end of the turn (it stays corked for the rest of the turn,
 * so the uncork already queued stays balanced). For a release that must reach Redis before something else this process
 * sends elsewhere: an HTTP response telling the client the lock is free.
 */
export function writeNow(client: object): void {
  const socket = (client as { stream?: Corkable }).stream;
  if (socket !== undefined && corked.has(socket)) sendNow(socket, 0);
}
