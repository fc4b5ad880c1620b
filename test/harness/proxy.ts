// A TCP proxy in front of a real redis-server, for network faults that signals cannot make: connections cut by the
// network (not by the server), and a reply that never comes back while the server is fine.
import net from 'node:net';

export interface Proxy {
  /** The loopback port clients connect to instead of the server's. */
  readonly port: number;
  /** Destroys every connection passing through now (the client sees the network drop; the server, its client leave). */
  cut(): void;
  /**
   * From now on, a connection whose client sends `command` (a RESP command name, any case) gets no more replies: what
   * the server sends back on it is dropped, as if it were lost on the way.
   */
  swallowRepliesAfter(command: string): void;
  /** Resolves when a client next sends `command` (a RESP command name, any case) through the proxy. */
  sent(command: string): Promise<void>;
  /**
   * The next chunk a client sends that contains `text` is not passed on: its connection is cut instead, as if the
   * network failed while the command was on its way (the client resends it after reconnecting). Once.
   */
  cutWhenSent(text: string): void;
  /**
   * Holds back what clients send from now on, as a slow network would: the server sees none of it until the returned
   * function is called, which passes it all on, in order, and lets later commands through again.
   */
  holdCommands(): () => void;
  /**
   * Holds back what the server sends from now on, as a slow network would: clients see none of it until the returned
   * function is called, which passes it all on, in order, and lets later replies through again.
   */
  holdReplies(): () => void;
  /** Closes the listener and every connection. */
  close(): Promise<void>;
}

/** Starts a proxy to `127.0.0.1:target` on a free loopback port. */
export async function startProxy(target: number): Promise<Proxy> {
  const sockets = new Set<net.Socket>();
  let swallow: RegExp | undefined;
  const watchers = new Set<{ pattern: RegExp; seen: () => void }>();
  let cutOn: string | undefined;
  const commands = holdable();
  const replies = holdable();
  const server = net.createServer((client) => {
    const upstream = net.connect({ host: '127.0.0.1', port: target });
    let deaf = false;
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on('error', () => s.destroy());
      s.on('close', () => {
        sockets.delete(s);
        (s === client ? upstream : client).destroy();
      });
    }
    client.on('data', (chunk: Buffer) => {
      // RESP arrays name the command as a bulk string: "$9\r\nsubscribe\r\n".
      const text = chunk.toString('latin1');
      if (cutOn !== undefined && text.includes(cutOn)) {
        cutOn = undefined;
        client.destroy();
        upstream.destroy();
        return;
      }
      if (swallow?.test(text)) deaf = true;
      for (const w of watchers) {
        if (!w.pattern.test(text)) continue;
        watchers.delete(w);
        w.seen();
      }
      commands.pass(() => upstream.write(chunk));
    });
    upstream.on('data', (chunk: Buffer) => {
      if (deaf) return;
      replies.pass(() => client.write(chunk));
    });
  });
  await new Promise<void>((resolve) => server.listen({ host: '127.0.0.1', port: 0 }, resolve));
  return {
    port: (server.address() as net.AddressInfo).port,
    cut() {
      for (const s of sockets) s.destroy();
    },
    swallowRepliesAfter(command) {
      swallow = commandPattern(command);
    },
    sent(command) {
      return new Promise((resolve) => watchers.add({ pattern: commandPattern(command), seen: resolve }));
    },
    cutWhenSent(text) {
      cutOn = text;
    },
    holdCommands: () => commands.hold(),
    holdReplies: () => replies.hold(),
    close() {
      for (const s of sockets) s.destroy();
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

/** One direction of the traffic, which can be held back: `pass` writes now or, while held, when the hold ends. */
function holdable(): { pass(write: () => void): void; hold(): () => void } {
  let held: (() => void)[] | undefined;
  return {
    pass(write) {
      if (held !== undefined) held.push(write);
      else write();
    },
    hold() {
      const queue: (() => void)[] = [];
      held = queue;
      return () => {
        if (held === queue) held = undefined;
        for (const write of queue) write();
      };
    },
  };
}

/** Matches a RESP chunk that names `command` as a bulk string. */
function commandPattern(command: string): RegExp {
  return new RegExp(`\\r\\n${command}\\r\\n`, 'i');
}
