// The middleware suites' fixture: one app builder and one HTTP client for Express 4, Express 5, Koa 2 and Koa 3, so
// every test runs unchanged against the four frameworks over real HTTP on the loopback.
import http, { type IncomingHttpHeaders } from 'node:http';
import net, { type AddressInfo } from 'node:net';
import type { Decision, Lease } from '@hasp/core';
import * as haspExpress from '@hasp/express';
import * as haspKoa from '@hasp/koa';

/** The four framework majors every suite runs against. */
export const FRAMEWORKS = ['express4', 'express5', 'koa2', 'koa3'] as const;
export type FrameworkName = (typeof FRAMEWORKS)[number];

// The middleware and the framework apps are typed per framework; the fixture passes them through untyped so one test
// body serves all four (each adapter's own types are checked by the packages and the examples).
/* eslint-disable @typescript-eslint/no-explicit-any */
type Any = any;

/** A request as a framework-neutral handler sees it. */
export interface Call {
  /** Express `req` or Koa `ctx`. */
  readonly raw: Any;
  readonly query: Record<string, string | undefined>;
  /** `req.lock` / `ctx.state.lock`. */
  readonly lock: Lease | undefined;
  /** `req.rateLimit` / `ctx.state.rateLimit`. */
  readonly rateLimit: Decision | undefined;
  /** True once the client has gone (the connection closed before the response was ended). */
  clientGone(): boolean;
  /** Resolves when the connection closes (client disconnect, or after the response). */
  closed(): Promise<void>;
}

/** What a neutral handler answers; `{ end: false }` leaves the response unended (Express: never calls res.end). */
export type Reply = { status?: number; body?: unknown; headers?: Record<string, string> } | { end: false };

/** A framework-neutral route handler; a thrown error or a rejection goes to the framework's error handling. */
export type Handler = (call: Call) => Reply | undefined | Promise<Reply | undefined>;

/** One route: middleware (made by this framework's rateLimit/withLock), then a handler. */
export interface Route {
  use?: unknown[];
  /** Mount `use` as its own layer in front of the route (Express: `app.use(path, …)`), not in the route's own stack. */
  mount?: 'route' | 'path';
  handle?: Handler;
  /** A native Express handler, used instead of `handle` on Express (e.g. one that calls next(err)). */
  express?: (req: Any, res: Any, next: (err?: unknown) => void) => unknown;
  /** A native Koa middleware, used instead of `handle` on Koa. */
  koa?: (ctx: Any, next: () => Promise<void>) => unknown;
}

export interface AppSpec {
  routes: Record<string, Route>;
  /** Express `trust proxy` / Koa `app.proxy`. */
  trustProxy?: boolean;
  /** `'json'` (default): an error handler that answers `{ code, message }` with err.status and err.headers;
   * `'default'`: the framework's own (Express's finalhandler, Koa's ctx.onerror); `'page'`: one that answers
   * err.status with a text page and sends none of err.headers (as most HTML error pages do); `'async'`: as 'json',
   * answering 20 ms later from an async function (on Express, anything that calls `next` after `next(err)` then
   * answers first). */
  errors?: 'json' | 'default' | 'page' | 'async';
  /** Address to listen on (default 127.0.0.1). */
  host?: string;
}

/** An HTTP error as the app's error handler received it. */
export interface SeenError {
  status?: number;
  expose?: boolean;
  code?: string;
  headers?: Record<string, string>;
  message: string;
}

export interface RunningApp {
  readonly url: string;
  readonly port: number;
  /** Every error that reached the app's error handling, in order. */
  readonly errors: SeenError[];
  close(): Promise<void>;
}

/** One framework major: its hasp middleware factories and an app builder. */
export interface Framework {
  readonly name: FrameworkName;
  readonly kind: 'express' | 'koa';
  rateLimit(options: Any): unknown;
  withLock(key: Any, options?: Any): unknown;
  start(spec: AppSpec): Promise<RunningApp>;
}

/** Loads one framework major (the npm aliases installed side by side in test/). */
export async function framework(name: FrameworkName): Promise<Framework> {
  switch (name) {
    case 'express4':
      return expressFramework(name, (await import('express4')).default);
    case 'express5':
      return expressFramework(name, (await import('express5')).default);
    case 'koa2':
      return koaFramework(name, (await import('koa2')).default);
    case 'koa3':
      return koaFramework(name, (await import('koa3')).default);
  }
}

function seen(err: Any): SeenError {
  return {
    status: err?.status ?? err?.statusCode,
    expose: err?.expose,
    code: err?.code,
    headers: err?.headers,
    message: String(err?.message ?? err),
  };
}

function isThenable(value: unknown): value is Promise<unknown> {
  return typeof (value as { then?: unknown } | null)?.then === 'function';
}

function listen(server: http.Server, host: string, errors: SeenError[]): Promise<RunningApp> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, host, () => {
      const { port } = server.address() as AddressInfo;
      const h = host.includes(':') ? `[${host}]` : host;
      resolve({
        url: `http://${h}:${port}`,
        port,
        errors,
        close: () =>
          new Promise<void>((done) => {
            server.close(() => done());
            server.closeAllConnections();
          }),
      });
    });
  });
}

function expressFramework(name: 'express4' | 'express5', express: Any): Framework {
  const asyncRouter = name === 'express5';
  return {
    name,
    kind: 'express',
    rateLimit: (o) => haspExpress.rateLimit(o),
    withLock: (k, o) => haspExpress.withLock(k, o),
    start(spec) {
      const app = express();
      // finalhandler logs every error to stderr unless env is 'test'.
      app.set('env', 'test');
      app.set('trust proxy', spec.trustProxy === true);
      for (const [path, route] of Object.entries(spec.routes)) {
        const handler = route.express ?? expressHandler(route.handle ?? (() => undefined), asyncRouter);
        if (route.mount === 'path' && route.use?.length) {
          app.use(path, ...route.use);
          app.all(path, handler);
        } else {
          app.all(path, ...(route.use ?? []), handler);
        }
      }
      const errors: SeenError[] = [];
      app.use((err: Any, _req: Any, res: Any, next: (e: unknown) => void) => {
        errors.push(seen(err));
        if (spec.errors === 'default' || res.headersSent) return next(err);
        if (spec.errors === 'page') return res.status(err?.status ?? 500).type('text').send('Sorry');
        const answer = (): void => {
          if (res.headersSent) return;
          res.status(err?.status ?? 500);
          if (err?.headers) res.set(err.headers);
          res.json({ code: err?.code, message: err?.expose ? err.message : 'Internal Server Error' });
        };
        // An async function's promise, as an `async` error handler returns: Express 5 treats that differently.
        if (spec.errors === 'async') return new Promise<void>((resolve) => setTimeout(resolve, 20)).then(answer);
        answer();
      });
      return listen(http.createServer(app), spec.host ?? '127.0.0.1', errors);
    },
  };
}

function expressHandler(handle: Handler, asyncRouter: boolean) {
  return (req: Any, res: Any, next: (err?: unknown) => void): unknown => {
    const call: Call = {
      raw: req,
      query: req.query,
      lock: req.lock,
      rateLimit: req.rateLimit,
      clientGone: () => res.destroyed && !res.writableEnded,
      closed: () => (res.closed ? Promise.resolve() : new Promise((r) => res.once('close', () => r()))),
    };
    const send = (reply: Reply | undefined): void => {
      if (reply !== undefined && 'end' in reply) return;
      if (reply?.headers) res.set(reply.headers);
      res.status(reply?.status ?? 200).json(reply?.body ?? { ok: true });
    };
    // A synchronous throw is caught by Express's router (both majors).
    const out = handle(call);
    if (!isThenable(out)) return send(out);
    // Express 5 handles a rejected promise itself (next(err)); Express 4 needs it passed on by hand.
    const sent = out.then(send);
    if (asyncRouter) return sent;
    sent.catch(next);
    return undefined;
  };
}

function koaFramework(name: 'koa2' | 'koa3', Koa: Any): Framework {
  return {
    name,
    kind: 'koa',
    rateLimit: (o) => haspKoa.rateLimit(o),
    withLock: (k, o) => haspKoa.withLock(k, o),
    start(spec) {
      const app = new Koa();
      app.proxy = spec.trustProxy === true;
      app.silent = true;
      const errors: SeenError[] = [];
      if (spec.errors === 'default') {
        app.on('error', (err: Any) => errors.push(seen(err)));
      } else {
        app.use(async (ctx: Any, next: () => Promise<void>) => {
          try {
            await next();
          } catch (err: Any) {
            errors.push(seen(err));
            ctx.status = err?.status ?? 500;
            if (spec.errors === 'page') {
              ctx.body = 'Sorry';
              return;
            }
            if (err?.headers) ctx.set(err.headers);
            ctx.body = { code: err?.code, message: err?.expose ? err.message : 'Internal Server Error' };
          }
        });
      }
      const routes = new Map(Object.entries(spec.routes));
      app.use((ctx: Any, next: () => Promise<void>) => {
        const route = routes.get(ctx.path);
        if (route === undefined) return next();
        const chain = [...((route.use ?? []) as Any[]), route.koa ?? koaHandler(route.handle ?? (() => undefined))];
        const dispatch = (i: number): Promise<void> =>
          i === chain.length ? Promise.resolve() : Promise.resolve(chain[i](ctx, () => dispatch(i + 1)));
        return dispatch(0);
      });
      return listen(http.createServer(app.callback()), spec.host ?? '127.0.0.1', errors);
    },
  };
}

function koaHandler(handle: Handler) {
  return async (ctx: Any): Promise<void> => {
    const res = ctx.res;
    const call: Call = {
      raw: ctx,
      query: ctx.query,
      lock: ctx.state.lock,
      rateLimit: ctx.state.rateLimit,
      clientGone: () => res.destroyed && !res.writableEnded,
      closed: () => (res.closed ? Promise.resolve() : new Promise((r) => res.once('close', () => r()))),
    };
    const reply = await handle(call);
    if (reply !== undefined && 'end' in reply) return;
    if (reply?.headers) ctx.set(reply.headers);
    ctx.status = reply?.status ?? 200;
    ctx.body = reply?.body ?? { ok: true };
  };
}

/** A response as the test client saw it. */
export interface Response {
  status: number;
  headers: IncomingHttpHeaders;
  body: Any;
  /** Milliseconds from sending to the end of the body. */
  ms: number;
}

export interface RequestOptions {
  method?: string;
  headers?: Record<string, string>;
  /** Local address to connect from (e.g. '::1'). */
  localAddress?: string;
}

/** A request in flight that the test can cut off (the client disconnects). */
export interface PendingRequest {
  readonly response: Promise<Response>;
  /** Destroys the connection: the server sees the client disconnect. */
  abort(): void;
}

/** Sends one request on a fresh connection (no keep-alive pool: each request is its own client). */
export function send(url: string, options: RequestOptions = {}): PendingRequest {
  const started = performance.now();
  let req: http.ClientRequest | undefined;
  const response = new Promise<Response>((resolve, reject) => {
    req = http.request(url, { method: options.method ?? 'GET', headers: options.headers, agent: false, localAddress: options.localAddress }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('error', reject);
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        let body: unknown = text;
        if (String(res.headers['content-type']).includes('json')) body = JSON.parse(text);
        resolve({ status: res.statusCode ?? 0, headers: res.headers, body, ms: performance.now() - started });
      });
    });
    req.on('error', reject);
    req.end();
  });
  return {
    response,
    abort: () => {
      response.catch(() => undefined);
      req?.destroy();
    },
  };
}

/** Sends one request and resolves its response. */
export function get(url: string, options?: RequestOptions): Promise<Response> {
  return send(url, options).response;
}

/** A promise with its resolve function, for events the test waits on (a handler started, a handler finished). */
export function deferred<T = void>(): { promise: Promise<T>; resolve: (value: T) => void } {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

/**
 * Sends GETs of `paths` pipelined on one keep-alive connection (each written before any answer came), reading and
 * dropping whatever comes back. The second request's response waits behind the first one's until its turn.
 */
export function pipelined(url: string, paths: readonly string[]): Promise<net.Socket> {
  return rawRequest(url, paths.map((p) => `GET ${p} HTTP/1.1\r\nHost: x\r\n\r\n`).join(''));
}

/** Writes `text` as it is on a new connection to `url`'s server (reading and dropping what comes back). */
export async function rawRequest(url: string, text: string): Promise<net.Socket> {
  const { hostname, port } = new URL(url);
  const socket = net.connect(Number(port), hostname);
  socket.on('error', () => undefined);
  socket.resume();
  await new Promise((resolve) => socket.once('connect', resolve));
  socket.write(text);
  return socket;
}
