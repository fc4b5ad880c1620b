// Keeps the READMEs' code honest: every TypeScript block is a region of a file in examples/snippets/src (type-checked
// by `pnpm typecheck`), the block must equal that region, and every snippet file runs to completion (exit 0) against
// private Redis servers, including the checks each file carries after its region.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startRedis, startRedisNodes, stopAll, type RedisNode } from '../harness/redis.js';
import { ROOT } from './shop-process.js';

/** The READMEs whose code blocks are checked. */
const READMES = ['README.md', 'packages/core/README.md', 'packages/express/README.md', 'packages/koa/README.md'];
const SNIPPETS = 'examples/snippets/src';
/** Files in SNIPPETS that are helpers, not snippets. */
const HELPERS = new Set(['check.ts']);
const CODE_LANGS = new Set(['ts', 'typescript', 'js', 'javascript', 'mjs', 'cjs', 'tsx']);
const RUN_TIMEOUT_MS = 30_000;
/** Snippet processes at once (tsx compiles each; the CI machine has two cores). */
const PARALLEL = 3;

interface Block {
  readme: string;
  line: number;
  /** `path#region` from the marker, or undefined for `<!-- not-run: why -->`. */
  ref: string | undefined;
  code: string;
}

const MARKER = /^<!--\s*snippet:\s*(\S+)\s*-->$/;
const NOT_RUN = /^<!--\s*not-run:\s*\S.*-->$/;

/** Code blocks without a marker, and other README mistakes: reported by a test instead of breaking collection. */
const problems: string[] = [];

/** The fenced code blocks of a README in one of CODE_LANGS, each with the marker on the line before it. */
function codeBlocks(readme: string): Block[] {
  const lines = fs.readFileSync(path.join(ROOT, readme), 'utf8').split('\n');
  const blocks: Block[] = [];
  for (let i = 0; i < lines.length; i++) {
    const open = /^(\s*)```(\w*)\s*$/.exec(lines[i]!);
    if (!open) continue;
    const end = lines.findIndex((l, j) => j > i && /^\s*```\s*$/.test(l));
    if (end === -1) {
      problems.push(`${readme}:${i + 1}: code block never closed`);
      break;
    }
    if (CODE_LANGS.has(open[2]!)) {
      let prev = i - 1;
      while (prev >= 0 && lines[prev]!.trim() === '') prev--;
      const marker = (lines[prev] ?? '').trim();
      const m = MARKER.exec(marker);
      if (!m && !NOT_RUN.test(marker)) {
        problems.push(
          `${readme}:${i + 1}: a ${open[2]} block needs a marker on the line before it: ` +
            `<!-- snippet: ${SNIPPETS}/<file>.ts --> (the block is that file's "#region readme"), ` +
            `or <!-- not-run: <why> --> for signatures that are not code`,
        );
      }
      const indent = open[1]!.length;
      blocks.push({ readme, line: i + 1, ref: m?.[1], code: lines.slice(i + 1, end).map((l) => l.slice(indent)).join('\n') });
    }
    i = end;
  }
  return blocks;
}

/** The regions of a snippet file: `// #region readme` (name '') or `// #region readme:<name>`, up to `// #endregion`. */
function regions(file: string): Map<string, string> {
  const lines = fs.readFileSync(path.join(ROOT, file), 'utf8').split('\n');
  const out = new Map<string, string>();
  let name: string | undefined;
  let body: string[] = [];
  lines.forEach((line, i) => {
    const open = /^\s*\/\/ #region readme(?::(\S+))?\s*$/.exec(line);
    if (open) {
      if (name !== undefined) throw new Error(`${file}:${i + 1}: region inside region`);
      name = open[1] ?? '';
      body = [];
      return;
    }
    if (/^\s*\/\/ #endregion/.test(line)) {
      if (name === undefined) throw new Error(`${file}:${i + 1}: #endregion without #region`);
      if (out.has(name)) throw new Error(`${file}: two regions named "${name}"`);
      out.set(name, body.join('\n'));
      name = undefined;
      return;
    }
    if (name !== undefined) body.push(line);
  });
  if (name !== undefined) throw new Error(`${file}: region "${name}" never closed`);
  return out;
}

function firstDifference(a: string, b: string): string {
  const x = a.split('\n');
  const y = b.split('\n');
  for (let i = 0; i < Math.max(x.length, y.length); i++) {
    if (x[i] !== y[i]) return `line ${i + 1} of the block:\n  README:  ${JSON.stringify(x[i])}\n  snippet: ${JSON.stringify(y[i])}`;
  }
  return 'no difference';
}

const snippetFiles = fs
  .readdirSync(path.join(ROOT, SNIPPETS))
  .filter((f) => f.endsWith('.ts') && !HELPERS.has(f))
  .sort();
const blocks = READMES.flatMap(codeBlocks);

describe('README code blocks', () => {
  it('every TypeScript block names the snippet file it comes from', () => {
    expect(problems).toEqual([]);
  });

  it.each(blocks.filter((b) => b.ref !== undefined).map((b) => [`${b.readme}:${b.line}`, b] as const))('%s equals its snippet', (_, b) => {
    const [file, name = ''] = b.ref!.split('#');
    expect(fs.existsSync(path.join(ROOT, file!)), `${b.readme}:${b.line}: ${file} does not exist`).toBe(true);
    const region = regions(file!).get(name);
    expect(region, `${file} has no "#region readme${name ? `:${name}` : ''}"`).toBeDefined();
    if (region !== b.code) {
      throw new Error(
        `${b.readme}:${b.line} differs from ${b.ref}: edit the snippet file (it is type-checked and run), then ` +
          '`pnpm --filter @hasp/example-snippets sync` copies it into the README; ' +
          firstDifference(b.code, region!),
      );
    }
  });

  it('every region of every snippet file is shown in a README', () => {
    const shown = new Set(blocks.map((b) => b.ref));
    const unshown: string[] = [];
    for (const f of snippetFiles) {
      const file = `${SNIPPETS}/${f}`;
      const names = [...regions(file).keys()];
      expect(names.length, `${file} has no "// #region readme"`).toBeGreaterThan(0);
      for (const name of names) {
        const ref = name === '' ? file : `${file}#${name}`;
        if (!shown.has(ref)) unshown.push(ref);
      }
    }
    expect(unshown).toEqual([]);
  });
});

describe('README snippets run', () => {
  let redis: RedisNode;
  let nodes: RedisNode[];
  let running = 0;
  const queue: (() => void)[] = [];

  beforeAll(async () => {
    [redis, nodes] = await Promise.all([startRedis(), startRedisNodes(3)]);
  });
  afterAll(stopAll);

  async function slot<T>(fn: () => Promise<T>): Promise<T> {
    if (running >= PARALLEL) await new Promise<void>((resolve) => queue.push(resolve));
    running++;
    try {
      return await fn();
    } finally {
      running--;
      queue.shift()?.();
    }
  }

  it.concurrent.each(snippetFiles.map((f, i) => [f, i] as const))('%s exits 0', async (file, i) => {
    // Each snippet gets its own database, so snippets running side by side never share a key.
    const db = i % 16;
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      REDIS_URL: `${redis.url}/${db}`,
      REDIS_NODES: nodes.map((n) => `${n.url}/${db}`).join(','),
    };
    const { code, output } = await slot(
      () =>
        new Promise<{ code: number | null; output: string }>((resolve) => {
          const child = spawn(process.execPath, ['--import', 'tsx', `src/${file}`], {
            cwd: path.join(ROOT, 'examples/snippets'),
            env,
            stdio: ['ignore', 'pipe', 'pipe'],
          });
          let out = '';
          child.stdout.setEncoding('utf8').on('data', (s: string) => (out += s));
          child.stderr.setEncoding('utf8').on('data', (s: string) => (out += s));
          // A snippet that does not end by itself leaks a timer or a connection: that is a failure too.
          const timer = setTimeout(() => {
            out += `\n[killed: still running after ${RUN_TIMEOUT_MS} ms]`;
            if (child.pid !== undefined) process.kill(child.pid, 'SIGKILL');
          }, RUN_TIMEOUT_MS);
          child.once('exit', (c) => {
            clearTimeout(timer);
            resolve({ code: c, output: out });
          });
        }),
    );
    expect(code, `examples/snippets/src/${file}:\n${output}`).toBe(0);
  });
});
