// Type-level checks (compiled by `pnpm typecheck`, never run): the Express middleware keeps a route's parameter,
// body and query types, and the Koa middleware accepts typed contexts.
import type { Decision, Lease, StoreErrorPolicy, StoreStateEvent } from '@hasp/core';
import { rateLimit, withLock } from '@hasp/express';
import { rateLimit as koaRateLimit, withLock as koaWithLock } from '@hasp/koa';
import express from 'express5';
import Koa from 'koa3';

/** Compiles only when A and B are the same type. */
type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
function assertType<T extends true>(_: T): void {}

const app = express();

// The handlers after withLock and rateLimit keep the route's parameter types: req.params.id is a string (Express's
// ParamsDictionary would make it string | string[], and | undefined under noUncheckedIndexedAccess). The key function
// itself sees Express's default request unless given the types (below).
app.post('/orders/:id/pay', withLock((req) => `order:${req.params.id}`), (req, res) => {
  assertType<Equal<typeof req.params.id, string>>(true);
  res.json({ id: req.params.id });
});
app.get(
  '/users/:user/files/:file',
  rateLimit({ capacity: 5, rate: '5/min', key: (req) => `${req.params.user}/${req.params.file}` }),
  withLock((req) => String(req.params.file)),
  (req, res) => {
    assertType<Equal<typeof req.params.user, string>>(true);
    assertType<Equal<typeof req.params.file, string>>(true);
    res.end();
  },
);

// Explicit request types (typed parameters, a typed body) reach the key and cost functions.
interface PayBody {
  amount: number;
}
app.post(
  '/pay/:account',
  rateLimit<{ account: string }, unknown, PayBody>({
    capacity: 100,
    rate: '100/h',
    key: (req) => {
      assertType<Equal<typeof req.params.account, string>>(true);
      return req.params.account;
    },
    cost: (req) => {
      assertType<Equal<typeof req.body.amount, number>>(true);
      return Math.min(100, Math.max(1, req.body.amount));
    },
  }),
  withLock<{ account: string }, unknown, PayBody>((req) => `${req.params.account}:${req.body.amount}`),
  (req, res) => {
    assertType<Equal<typeof req.params.account, string>>(true);
    res.end();
  },
);

// A handler option sees the same request type.
app.get(
  '/sms/:to',
  rateLimit<{ to: string }>({
    capacity: 3,
    rate: '3/10min',
    key: (req) => req.params.to,
    handler: (req, res, _next, decision) => {
      assertType<Equal<typeof req.params.to, string>>(true);
      res.status(429).json({ to: req.params.to, retryAfter: decision.retryAfter });
    },
  }),
  (req, res) => {
    assertType<Equal<typeof req.params.to, string>>(true);
    res.end();
  },
);

// A key function typed by its parameter annotation.
app.delete('/carts/:cart', withLock((req: express.Request<{ cart: string }>) => req.params.cart), (req, res) => {
  assertType<Equal<typeof req.params.cart, string>>(true);
  res.end();
});

// Assignable to Express's RequestHandler, and still usable as plain app-wide middleware.
const handlers: express.RequestHandler[] = [rateLimit({ capacity: 10, rate: 10 }), withLock(() => 'global')];
app.use(rateLimit({ capacity: 10, rate: 10 }));
app.use(withLock(() => 'global'), ...handlers);

const koa = new Koa();
koa.use(koaRateLimit({ capacity: 10, rate: '10/s', key: (ctx) => ctx.ip }));
koa.use(koaWithLock((ctx) => ctx.path));

// An app with typed state: key functions and handlers written for its context fit, and so does the middleware.
interface AppState {
  user: { id: string };
}
const typedKoa = new Koa<AppState>();
const byUser = (ctx: Koa.ParameterizedContext<AppState>): string => ctx.state.user.id;
typedKoa.use(koaRateLimit({ capacity: 10, rate: '10/min', key: byUser }));
typedKoa.use(
  koaRateLimit({
    capacity: 10,
    rate: '10/min',
    key: byUser,
    handler: (ctx) => {
      assertType<Equal<typeof ctx.state.user.id, string>>(true);
      ctx.status = 429;
    },
  }),
);
typedKoa.use(koaWithLock(byUser, { ttl: 5_000 }));
typedKoa.use(koaWithLock((ctx: Koa.ParameterizedContext<AppState>) => `user:${ctx.state.user.id}`));
// A state type that extends DefaultState has the lease and the decision (the README says so).
interface ExtendedState extends Koa.DefaultState {
  user: { id: string };
}
new Koa<ExtendedState>().use(koaWithLock((ctx) => ctx.path)).use((ctx) => {
  assertType<Equal<typeof ctx.state.lock, Lease | undefined>>(true);
  assertType<Equal<typeof ctx.state.rateLimit, Decision | undefined>>(true);
  ctx.body = ctx.state.lock?.fence;
});

// onStoreState's event is typed in both adapters, and exported for hooks written apart.
const logOutage = (e: StoreStateEvent): void => {
  assertType<Equal<StoreStateEvent['state'], 'down' | 'up'>>(true);
  console.warn(`rate limiter's Redis is ${e.state}`, e.error);
};
app.use(rateLimit({ capacity: 10, rate: 10, onStoreState: logOutage }));
new Koa().use(koaRateLimit({ capacity: 10, rate: 10, onStoreState: (e: StoreStateEvent) => void e.error }));
// onStoreError's type, exported for options written apart.
const policy: StoreErrorPolicy = 'closed';
app.use(rateLimit({ capacity: 10, rate: 10, onStoreError: policy }));
