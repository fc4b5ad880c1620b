// `pnpm run docs` builds the API reference, and every public export carries TSDoc: TypeDoc's validation (undocumented
// exports, broken {@link}s) runs over the three packages (typedoc.json, and each package's typedoc.json naming its entry
// points) with its warnings treated as errors. The root README, the docs' front page, is left out: its links are not API.
import { execFile } from 'node:child_process';
import path from 'node:path';
import { promisify } from 'node:util';
import { expect, it } from 'vitest';
import { ROOT } from './shop-process.js';

const run = promisify(execFile);

it('TypeDoc documents every export of @hasp/core, @hasp/core/http, @hasp/express and @hasp/koa', async () => {
  const typedoc = path.join(ROOT, 'node_modules/typedoc/bin/typedoc');
  const result = await run(process.execPath, [typedoc, '--emit', 'none', '--readme', 'none', '--treatValidationWarningsAsErrors'], {
    cwd: ROOT,
    timeout: 60_000,
  }).catch((err: { stdout?: string; stderr?: string; code?: number }) => err);
  const output = `${result.stdout ?? ''}${result.stderr ?? ''}`;
  expect('code' in result ? result.code : 0, output).toBe(0);
  expect(output).not.toMatch(/does not have any documentation|Failed to resolve link/);
}, 90_000);
