// hasp's process warnings, each emitted once per process: the record is on globalThis (Symbol.for), so an app that
// loads both builds of @hasp/core (ESM and CommonJS) is not warned twice.
const WARNED = Symbol.for('hasp.warned');

/** Emits `message` as a process warning with `code`, unless a warning with that code was emitted already. */
export function warnOnce(code: string, message: string): void {
  const g = globalThis as { [WARNED]?: Set<string> };
  const warned = (g[WARNED] ??= new Set());
  if (warned.has(code)) return;
  warned.add(code);
  process.emitWarning(message, { code });
}
