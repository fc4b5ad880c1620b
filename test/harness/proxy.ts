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
  /** Closes the listener and every connection. */
  close(): Promise<void>;
}

/** Starts a proxy to `127.0.0.1:target` on a free loopback port. */
export async function startProxy(target: number): Promise<Proxy> {
  const sockets = new Set<net.Socket>();
  let swallow: RegExp | undefined;
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
      if (swallow?.test(chunk.toString('latin1'))) deaf = true;
      upstream.write(chunk);
    });
    upstream.on('data', (chunk: Buffer) => {
      if (!deaf) client.write(chunk);
    });
  });
  await new Promise<void>((resolve) => server.listen({ host: '127.0.0.1', port: 0 }, resolve));
  return {
    port: (server.address() as net.AddressInfo).port,
    cut() {
      for (const s of sockets) s.destroy();
    },
    swallowRepliesAfter(command) {
      swallow = new RegExp(`\\r\\n${command}\\r\\n`, 'i');
    },
    close() {
      for (const s of sockets) s.destroy();
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
}
