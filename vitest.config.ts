// Vitest configuration for the whole monorepo: unit tests beside the code, cross-package and fault tests in test/.
import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts', 'packages/*/src/**/*.test.ts'],
    exclude: ['**/node_modules/**', '**/dist/**'],
    globalSetup: ['test/harness/global-setup.ts'],
    setupFiles: ['test/harness/setup-worker.ts'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    // Child processes, not threads: test files start redis-server processes and
    // send them signals, and the harness kills its servers when a worker exits (or,
    // through its watcher, when it is killed or orphaned).
    pool: 'forks',
    poolOptions: {
      // Two cores: each worker can drive several redis-server processes.
      forks: { minForks: 1, maxForks: 2 },
    },
  },
});
