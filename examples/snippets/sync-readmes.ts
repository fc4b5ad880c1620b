// Copies each snippet region into the README code block that names it (`<!-- snippet: path#region -->`), so after
// editing a snippet file `pnpm --filter @hasp/example-snippets sync` updates the READMEs. test/examples/snippets.test.ts
// fails while a README and its snippet differ.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const readmes = ['README.md', 'packages/core/README.md', 'packages/express/README.md', 'packages/koa/README.md'];

function region(ref: string): string {
  const [file, name = ''] = ref.split('#');
  const lines = fs.readFileSync(path.join(root, file!), 'utf8').split('\n');
  const open = lines.findIndex((l) => l.trim() === (name ? `// #region readme:${name}` : '// #region readme'));
  if (open === -1) throw new Error(`${file} has no "#region readme${name ? `:${name}` : ''}"`);
  const close = lines.findIndex((l, i) => i > open && /^\s*\/\/ #endregion/.test(l));
  return lines.slice(open + 1, close).join('\n');
}

let changed = 0;
for (const readme of readmes) {
  const file = path.join(root, readme);
  if (!fs.existsSync(file)) continue;
  const lines = fs.readFileSync(file, 'utf8').split('\n');
  const out: string[] = [];
  for (let i = 0; i < lines.length; i++) {
    out.push(lines[i]!);
    const m = /^<!--\s*snippet:\s*(\S+)\s*-->$/.exec(lines[i]!.trim());
    if (!m) continue;
    let j = i + 1;
    while (j < lines.length && lines[j]!.trim() === '') out.push(lines[j++]!);
    const fence = /^```(\w*)\s*$/.exec(lines[j] ?? '');
    if (!fence) throw new Error(`${readme}:${i + 1}: the marker must be followed by a code block`);
    const end = lines.findIndex((l, k) => k > j && /^```\s*$/.test(l));
    const code = region(m[1]!);
    if (lines.slice(j + 1, end).join('\n') !== code) changed++;
    out.push(lines[j]!, ...code.split('\n'), lines[end]!);
    i = end;
  }
  fs.writeFileSync(file, out.join('\n'));
}
console.log(`${changed} README block(s) updated`);
