// Starts a shop: PORT (default 3000, 0 = any free port), REDIS_URL / REDIS_NODES, PAYMENT_MS; stops on SIGINT/SIGTERM.
import { createServer, type RequestListener, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { storesFromEnv, type Stores } from './stores.js';

/** Settings of the shop that tests and demos may change. */
export interface ShopOptions {
  /** How long the fake payment takes, ms. */
  paymentMs: number;
}

/**
 * Reads PORT and PAYMENT_MS, builds the stores from the environment and serves `createHandler(stores, options)`.
 * Prints `hasp <name> listening on <url>`, the store and the `curl` commands to try; on SIGINT/SIGTERM closes the
 * server and the Redis connections and lets the process end by itself.
 * @throws RangeError if PORT is not a port number or PAYMENT_MS not a number of ms.
 */
export function serveShop(name: string, createHandler: (stores: Stores, options: ShopOptions) => RequestListener): void {
  const port = Number(process.env.PORT ?? 3000);
  const paymentMs = Number(process.env.PAYMENT_MS ?? 1_500);
  if (!Number.isInteger(port) || port < 0 || port > 65_535) throw new RangeError(`PORT must be a port number, got ${process.env.PORT}`);
  if (!Number.isFinite(paymentMs) || paymentMs < 0) throw new RangeError(`PAYMENT_MS must be a number of ms, got ${process.env.PAYMENT_MS}`);

  const stores = storesFromEnv();
  const server = createServer(createHandler(stores, { paymentMs }));
  server.listen(port, () => {
    const url = `http://localhost:${(server.address() as AddressInfo).port}`;
    console.log(`hasp ${name} listening on ${url}`);
    console.log(`store: ${stores.description}`);
    console.log(tryIt(url));
  });
  server.on('error', (err) => {
    console.error(`cannot listen on port ${port}: ${err.message} (set PORT to another port, or PORT=0 for any free one)`);
    void stores.close().finally(() => process.exit(1));
  });

  let stopping = false;
  // Responses not sent yet: once stopping, each goes out with `Connection: close`, so that a keep-alive connection
  // ends with its last response instead of idling for keepAliveTimeout after server.close().
  const running = new Set<ServerResponse>();
  let drained: (() => void) | undefined;
  server.on('request', (_req, res: ServerResponse) => {
    if (stopping) res.setHeader('connection', 'close');
    running.add(res);
    res.on('close', () => {
      running.delete(res);
      if (running.size === 0) drained?.();
    });
  });
  let closing: Promise<void> | undefined;
  // Redis is closed once every response has closed, and a turn later: a response's other 'close' listeners (withLock's,
  // which releases its lock) run after this one, and the release must be sent before QUIT.
  const closeStores = (): Promise<void> =>
    (closing ??= new Promise<void>((resolve) => (running.size === 0 ? resolve() : (drained = resolve)))
      .then(() => new Promise((resolve) => setImmediate(resolve)))
      .then(() => stores.close()));
  function stop(signal: string): void {
    if (stopping) return;
    stopping = true;
    console.log(`${signal}: stopping`);
    for (const res of running) if (!res.headersSent) res.setHeader('connection', 'close');
    // Redis is closed last, once every request is answered: the locks they hold are released on the way.
    server.close(() => void closeStores());
    server.closeIdleConnections();
    // Requests still running (a slow payment) get a few seconds to finish; without them the process ends by itself.
    setTimeout(() => {
      console.error('requests still running after 5 s: closing their connections');
      // Their handlers could still answer, so their locks stay (on Express until the response is ended or collected,
      // on Koa until the handler returns): those of handlers cut off by the exit last until their ttl. A Redis that
      // does not answer gets a second, no more.
      server.closeAllConnections();
      const gaveUp = new Promise((resolve) => setTimeout(resolve, 1_000).unref());
      void Promise.race([closeStores(), gaveUp]).finally(() => process.exit(1));
    }, 5_000).unref();
  }
  process.on('SIGINT', () => stop('SIGINT'));
  process.on('SIGTERM', () => stop('SIGTERM'));
}

function tryIt(url: string): string {
  const json = `-H 'content-type: application/json'`;
  return [
    '',
    'Try it (in another terminal):',
    '  # SMS codes: 3 per phone number per 10 minutes; the 4th answers 429 with Retry-After and RateLimit headers',
    `  for i in 1 2 3 4; do curl -si -X POST ${url}/sms/send ${json} -d '{"phone":"+15551234567"}' | head -1; done`,
    '  # Logins: 5 attempts per username and IP per 15 minutes (alice / wonderland is the right password)',
    `  for i in 1 2 3 4 5 6; do curl -s -X POST ${url}/login ${json} -d '{"username":"alice","password":"guess"}'; echo; done`,
    '  # Purchase order 42 twice at once: one 200, one 423 Locked; the order shows exactly 1 purchase',
    `  for i in 1 2; do curl -s -w ' -> %{http_code}\\n' -X POST ${url}/orders/42/purchase & done; wait`,
    `  curl -s ${url}/orders/42; echo`,
    `  curl -s ${url}/health; echo`,
    '',
  ].join('\n');
}
