// Per-framework set-up for middleware test files, apart from apps.ts: that module is also loaded by app processes the
// tests start (app-process.ts), outside vitest, where importing vitest fails.
import { afterEach, beforeAll } from 'vitest';
import { framework, type AppSpec, type Framework, type FrameworkName, type RunningApp } from './apps.js';

/**
 * For a `describe` of one framework: loads it before the tests, and closes after each test the apps started through
 * `start`. Call it at the top of the describe's body.
 */
export function frameworkSuite(name: FrameworkName): { fw: () => Framework; start: (spec: AppSpec) => Promise<RunningApp> } {
  let loaded: Framework | undefined;
  const apps: RunningApp[] = [];
  beforeAll(async () => {
    loaded = await framework(name);
  });
  afterEach(async () => {
    await Promise.all(apps.splice(0).map((a) => a.close()));
  });
  const fw = (): Framework => loaded ?? assertNever('frameworkSuite: used before its beforeAll ran');
  return {
    fw,
    start: async (spec) => {
      const app = await fw().start(spec);
      apps.push(app);
      return app;
    },
  };
}

function assertNever(message: string): never {
  throw new Error(message);
}
