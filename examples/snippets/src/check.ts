// Helpers for the checks at the end of each snippet (the part the README does not show): serve an app, send requests.
import assert from 'node:assert/strict';
import { createServer, type RequestListener } from 'node:http';
import type { AddressInfo } from 'node:net';

export { assert };

/** Serves `handler` (an Express app, or a Koa app's `callback()`) on a free loopback port. */
export async function serve(handler: RequestListener): Promise<{ url: string; close: () => Promise<void> }> {
  const server = createServer(handler);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return {
    url,
    close: () =>
      new Promise<void>((resolve, reject) => {
        server.close((err) => (err ? reject(err) : resolve()));
        server.closeAllConnections();
      }),
  };
}

/** A request and what came back: status, headers, and the body as JSON (or text when it is not JSON). */
export async function send(
  method: string,
  url: string,
  body?: unknown,
): Promise<{ status: number; headers: Headers; body: Record<string, unknown> | string }> {
  const res = await fetch(url, {
    method,
    ...(body === undefined ? {} : { headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) }),
    signal: AbortSignal.timeout(10_000),
  });
  const text = await res.text();
  let parsed: Record<string, unknown> | string = text;
  try {
    parsed = JSON.parse(text) as Record<string, unknown>;
  } catch {
    // not JSON: keep the text
  }
  return { status: res.status, headers: res.headers, body: parsed };
}

/** The statuses of `n` requests sent one after another. */
export async function statuses(n: number, method: string, url: string, body?: unknown): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < n; i++) out.push((await send(method, url, body)).status);
  return out;
}
