import { defineConfig } from 'tsup';

export default defineConfig({
  entry: { index: 'src/index.ts', http: 'src/http/index.ts' },
  format: ['esm', 'cjs'],
  dts: true,
  sourcemap: true,
  clean: true,
  target: 'node20',
  // One copy of the shared code behind both entry points: two would keep two sets of per-connection state (merged
  // calls, script caches, wake-up subscriptions) for the same client, and ordering between them would be lost.
  splitting: true,
});
