// hasp's error classes name themselves: a minifier that renames classes (esbuild --minify, webpack production)
// must not turn `LockBusyError` into `Qi` in logs and in code that reads err.name.
import { createRequire } from 'node:module';
import { describe, expect, it } from 'vitest';
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
