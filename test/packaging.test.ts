// Packaging test: packs @hasp/core, @hasp/express and @hasp/koa, installs the tarballs into a scratch
// project with npm, and both require()s and imports them there (needs `pnpm build` first).
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import { mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const packages = ['core', 'express', 'koa'] as const;
const TIMEOUT_MS = 180_000;

const execFileAsync = promisify(execFile);

/** execFile that fails with the command's own output, not just "Command failed". */
async function exec(
  file: string,
  args: string[],
  options: { cwd: string; env?: NodeJS.ProcessEnv; timeout?: number },
): Promise<{ stdout: string; stderr: string }> {
  try {
    return await execFileAsync(file, args, { ...options, maxBuffer: 16 * 1024 * 1024 });
  } catch (err) {
    const { stdout = '', stderr = '', killed = false } = err as { stdout?: string; stderr?: string; killed?: boolean };
    const why = killed ? `did not exit within ${options.timeout} ms` : 'failed';
    throw new Error(`\`${path.basename(file)} ${args.join(' ')}\` in ${options.cwd} ${why}:\n${stdout}${stderr}`, {
      cause: err,
    });
  }
}


const coreExports = [
  'RedisLock',
  'Redlock',
  'MemoryLock',
  'TokenBucket',
  'HaspError',
  'LockBusyError',
  'LockUnavailableError',
  'LockLostError',
];
const adapterExports = ['rateLimit', 'withLock'];

/**
 * The checks both scripts run, after `assert`, `core`, `express`, `koa` and
 * `LABEL` are bound and `deepImport()` tries to load `@hasp/core/dist/index.js`. The script must end
 * by itself: nothing hasp starts may keep a process alive.
 */
const checks = `
async function main(label) {
  for (const name of ${JSON.stringify(coreExports)}) {
    assert.equal(typeof core[name], 'function', label + ': @hasp/core exports ' + name);
  }
  for (const [pkg, mod] of [['@hasp/express', express], ['@hasp/koa', koa]]) {
    for (const name of ${JSON.stringify(adapterExports)}) {
      assert.equal(typeof mod[name], 'function', label + ': ' + pkg + ' exports ' + name);
    }
  }

  // One copy of the code behind both entry points (per module format): the adapters' buckets and lockers are
  // @hasp/core's own classes, and state kept per Redis connection exists once.
  const limiter = new http.RateLimiter({ capacity: 1, rate: 1 }, () => 'k');
  assert.ok(limiter.bucket instanceof core.TokenBucket, label + ': @hasp/core/http builds @hasp/core classes');

  const lease = await new core.MemoryLock().tryAcquire('k');
  assert.ok(lease, label + ': MemoryLock.tryAcquire on a free key returns a lease');
  assert.equal(typeof lease.fence, 'number', label + ': lease.fence is a number');
  assert.ok(Number.isFinite(lease.fence), label + ': lease.fence is finite');
  await lease.release();

  const decision = await new core.TokenBucket({ capacity: 2, rate: 1 }).take('x');
  assert.equal(decision.allowed, true, label + ': first take is allowed');
  assert.equal(decision.limit, 2, label + ': limit is the capacity');
  assert.equal(decision.remaining, 1, label + ': one token left');

  await assert.rejects(
    async () => deepImport(),
    (err) => err.code === 'ERR_PACKAGE_PATH_NOT_EXPORTED',
    label + ': the exports map hides @hasp/core/dist/index.js',
  );
  console.log(label + ' ok');
}
main(LABEL).catch((err) => {
  console.error(err);
  process.exitCode = 1;
});
`;

const cjsScript = `'use strict';
const LABEL = 'require';
const assert = require('node:assert/strict');
const core = require('@hasp/core');
const http = require('@hasp/core/http');
const express = require('@hasp/express');
const koa = require('@hasp/koa');
const deepImport = () => require.resolve('@hasp/core/dist/index.js');
${checks}`;

const esmScript = `import assert from 'node:assert/strict';
import * as core from '@hasp/core';
import * as http from '@hasp/core/http';
import * as express from '@hasp/express';
import * as koa from '@hasp/koa';
const LABEL = 'import';
const deepImport = () => import('@hasp/core/dist/index.js');
${checks}`;

// What a TypeScript user writes against the packages: options given as possibly-undefined values (which the runtime
// takes as "not given"), the subpath entry point, and both adapters.
const consumerTs = `import { Redis } from 'ioredis';
import express from 'express';
import Koa from 'koa';
import { MemoryLock, RedisLock, TokenBucket, type Lease } from '@hasp/core';
import { RateLimiter, type StoreStateEvent } from '@hasp/core/http';
import { rateLimit, withLock } from '@hasp/express';
import { rateLimit as koaRateLimit, withLock as koaWithLock } from '@hasp/koa';

const url: string | undefined = process.env['REDIS_URL'];
const redis: Redis | undefined = url === undefined ? undefined : new Redis(url, { lazyConnect: true });
const ttl: number | undefined = process.env['TTL'] === undefined ? undefined : Number(process.env['TTL']);
const signal: AbortSignal | undefined = undefined;

const app = express();
app.post('/sms', rateLimit({ capacity: 3, rate: '3/10min', redis, key: (req) => String(req.body?.phone), handler: undefined }), (_req, res) => {
  res.end();
});
app.post('/orders/:id', withLock((req) => \`order:\${req.params.id}\`, { redis, ttl, wait: undefined }), (req, res) => {
  const lease: Lease | undefined = req.lock;
  res.json({ fence: lease?.fence });
});
const koa = new Koa();
koa.use(koaRateLimit({ capacity: 1, rate: 1, redis, onStoreState: (e: StoreStateEvent) => void e.state }));
koa.use(koaWithLock((ctx) => ctx.path, { redis, autoExtend: undefined }));
const limiter = new RateLimiter({ capacity: 1, rate: 1 }, () => 'k');
void limiter;
void new TokenBucket({ capacity: 1, rate: 1, redis, prefix: undefined });
void new MemoryLock({ ttl }).acquire('k', { ttl, signal, owner: undefined });
if (redis !== undefined) void new RedisLock(redis, { timeout: undefined });
`;

/** Compiler settings every consumer project shares: as strict as users make them, libraries checked too. */
const strictest = {
  strict: true,
  exactOptionalPropertyTypes: true,
  noUncheckedIndexedAccess: true,
  skipLibCheck: false,
  // @types/koa 3 reads the Options type of @types/content-disposition; npm hoists content-disposition itself (a
  // dependency of koa 3, with types of its own and no such export) to where that import finds it first.
  paths: { 'content-disposition': ['./node_modules/@types/content-disposition'] },
  esModuleInterop: true,
  noEmit: true,
  types: ['node'],
};

/** Module settings users have: Node's own resolution, a bundler's, and TypeScript's old CommonJS one (no exports map). */
const consumerConfigs: Record<string, object> = {
  nodenext: { module: 'nodenext', moduleResolution: 'nodenext', files: ['consumer.ts', 'consumer.mts'] },
  node16: { module: 'node16', moduleResolution: 'node16', files: ['consumer.ts', 'consumer.mts'] },
  bundler: { module: 'preserve', moduleResolution: 'bundler', files: ['consumer.ts'] },
  node10: { module: 'commonjs', moduleResolution: 'node10', ignoreDeprecations: '6.0', files: ['consumer.ts'] },
};

describe('packed packages', () => {
  let work: string;
  let scratch: string;

  beforeAll(async () => {
    const missing = packages.filter((name) => !fs.existsSync(path.join(root, 'packages', name, 'dist')));
    if (missing.length > 0) {
      throw new Error(
        `packages/{${missing.join(',')}}/dist missing: run \`pnpm build\` first (\`pnpm test\` does it).`,
      );
    }

    work = await mkdtemp(path.join(os.tmpdir(), 'hasp-packaging-'));
    const tarballs = path.join(work, 'tarballs');
    scratch = path.join(work, 'app');
    fs.mkdirSync(tarballs);
    fs.mkdirSync(scratch);

    const dependencies: Record<string, string> = {};
    for (const name of packages) {
      const before = new Set(await readdir(tarballs));
      await exec('pnpm', ['pack', '--pack-destination', tarballs], {
        cwd: path.join(root, 'packages', name),
        env: { ...process.env, CI: 'true' },
      });
      const created = (await readdir(tarballs)).filter((file) => file.endsWith('.tgz') && !before.has(file));
      expect(created, `pnpm pack of packages/${name}`).toHaveLength(1);
      dependencies[`@hasp/${name}`] = `file:${path.join(tarballs, created[0] as string)}`;
    }

    await writeFile(
      path.join(scratch, 'package.json'),
      JSON.stringify(
        {
          name: 'hasp-packaging-scratch',
          version: '0.0.0',
          private: true,
          dependencies: { ...dependencies, ioredis: '^5', express: '^5', koa: '^3' },
          devDependencies: { '@types/express': '^5', '@types/koa': '^3', '@types/node': '^20' },
          // The adapters' `@hasp/core` range must be met by the tarball, never by the registry.
          overrides: { '@hasp/core': '$@hasp/core' },
        },
        null,
        2,
      ),
    );
    await writeFile(path.join(scratch, 'check.cjs'), cjsScript);
    await writeFile(path.join(scratch, 'check.mjs'), esmScript);
    await writeFile(path.join(scratch, 'consumer.ts'), consumerTs);
    await writeFile(path.join(scratch, 'consumer.mts'), consumerTs);
    for (const [name, { files, ...module }] of Object.entries(consumerConfigs) as [string, { files: string[] }][]) {
      const config = { compilerOptions: { ...strictest, ...module }, files };
      await writeFile(path.join(scratch, `tsconfig.${name}.json`), JSON.stringify(config, null, 2));
    }

    await exec('npm', ['install', '--no-audit', '--no-fund', '--prefer-offline', '--loglevel=error'], {
      cwd: scratch,
      env: { ...process.env, CI: 'true' },
    });
  }, TIMEOUT_MS);

  afterAll(async () => {
    if (work) await rm(work, { recursive: true, force: true });
  });

  it.each(packages)('ships @hasp/%s with its licence text, README and build, and nothing else', (name) => {
    const installed = path.join(scratch, 'node_modules', '@hasp', name);
    expect(fs.readFileSync(path.join(installed, 'LICENSE'), 'utf8')).toMatch(/^MIT License/);
    expect(fs.readdirSync(installed).sort()).toEqual(['LICENSE', 'README.md', 'dist', 'package.json']);
  });

  it.each(Object.keys(consumerConfigs))('type-checks for a strict TypeScript project with %s resolution', async (name) => {
    // The repository's own compiler, on the scratch project's installed packages and types.
    await exec(path.join(root, 'node_modules', '.bin', 'tsc'), ['-p', `tsconfig.${name}.json`], { cwd: scratch, timeout: 120_000 });
  }, TIMEOUT_MS);

  for (const [kind, file] of [
    ['require()', 'check.cjs'],
    ['import', 'check.mjs'],
  ] as const) {
    it(`works through ${kind}`, async () => {
      // A timeout here means something hasp started keeps the process alive.
      const { stdout } = await exec(process.execPath, [file], { cwd: scratch, timeout: 30_000 });
      expect(stdout).toContain(kind === 'import' ? 'import ok' : 'require ok');
    }, TIMEOUT_MS);
  }
});
