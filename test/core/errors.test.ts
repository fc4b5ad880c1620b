// hasp's error classes name themselves: a minifier that renames classes (esbuild --minify, webpack production)
// must not turn `LockBusyError` into `Qi` in logs and in code that reads err.name.
import { createRequire } from 'node:module';
import {
  LockBusyError as PublishedBusy,
  LockLostError as PublishedLost,
  LockUnavailableError as PublishedUnavailable,
  RateLimitUnavailableError as PublishedRateLimitDown,
  type StoreStateEvent,
} from '@hasp/core';
import { describe, expect, expectTypeOf, it } from 'vitest';
import { LockBusyError, LockLostError, LockUnavailableError, RateLimitUnavailableError } from '../../packages/core/src/index.js';

describe('error names', () => {
  it('stay the documented ones when the classes were renamed, as a minified bundle renames them', () => {
    const classes = { LockBusyError, LockLostError, LockUnavailableError, RateLimitUnavailableError };
    const make = {
      LockBusyError: () => new LockBusyError('k', 10),
      LockLostError: () => new LockLostError('k'),
      LockUnavailableError: () => new LockUnavailableError('down'),
      RateLimitUnavailableError: () => new RateLimitUnavailableError('down'),
    };
    const original = Object.entries(classes).map(([name, cls]) => [cls, Object.getOwnPropertyDescriptor(cls, 'name')!, name] as const);
    try {
      for (const [cls] of original) Object.defineProperty(cls, 'name', { value: 'Qi', configurable: true });
      for (const [name, f] of Object.entries(make)) {
        const error = f();
        expect([error.name, String(error).split(':')[0]]).toEqual([name, name]);
      }
    } finally {
      for (const [cls, descriptor] of original) Object.defineProperty(cls, 'name', descriptor);
    }
  });

  it("name a subclass of the user's by its own class", () => {
    class PaymentBusy extends LockBusyError {}
    class StoreDown extends RateLimitUnavailableError {}
    expect([new PaymentBusy('k').name, new StoreDown('down').name]).toEqual(['PaymentBusy', 'StoreDown']);
  });

  it('keep their class names in the built packages (a class named inside its own body is renamed by the bundler)', async () => {
    // Needs `pnpm build`.
    const cjs = createRequire(import.meta.url)('../../packages/core/dist/index.cjs') as Record<string, { name: string }>;
    const esm = (await import('../../packages/core/dist/index.js')) as Record<string, { name: string }>;
    const names = ['HaspError', 'LockBusyError', 'LockLostError', 'LockUnavailableError', 'RateLimitUnavailableError'];
    for (const build of [cjs, esm]) expect(names.map((n) => build[n]!.name)).toEqual(names);
  });
});

// Checked by `pnpm typecheck` (the assertions are on types, on the published declarations); the run checks the values.
describe('error types', () => {
  it('narrow the code with instanceof, as the code narrows nothing else', () => {
    const errors: unknown[] = [new PublishedBusy('k'), new PublishedLost('k'), new PublishedUnavailable('down'), new PublishedRateLimitDown('down')];
    const codes = errors.map((e) => {
      if (e instanceof PublishedBusy) {
        expectTypeOf(e.code).toEqualTypeOf<'LOCK_BUSY'>();
        return e.code;
      }
      if (e instanceof PublishedLost) {
        expectTypeOf(e.code).toEqualTypeOf<'LOCK_LOST'>();
        return e.code;
      }
      if (e instanceof PublishedUnavailable) {
        expectTypeOf(e.code).toEqualTypeOf<'LOCK_UNAVAILABLE'>();
        return e.code;
      }
      if (e instanceof PublishedRateLimitDown) {
        expectTypeOf(e.code).toEqualTypeOf<'RATE_LIMIT_UNAVAILABLE'>();
        return e.code;
      }
      return undefined;
    });
    expect(codes).toEqual(['LOCK_BUSY', 'LOCK_LOST', 'LOCK_UNAVAILABLE', 'RATE_LIMIT_UNAVAILABLE']);
  });

  it("type onStoreState's event: 'down' carries a RateLimitUnavailableError, 'up' no error", () => {
    const seen: string[] = [];
    const hook = (event: StoreStateEvent): void => {
      if (event.state === 'down') {
        expectTypeOf(event.error).toEqualTypeOf<PublishedRateLimitDown>();
        seen.push(event.error.code);
      } else {
        expectTypeOf(event.error).toEqualTypeOf<undefined>();
        seen.push(event.state);
      }
    };
    hook({ state: 'down', error: new PublishedRateLimitDown('down') });
    hook({ state: 'up' });
    expect(seen).toEqual(['RATE_LIMIT_UNAVAILABLE', 'up']);
  });
});
