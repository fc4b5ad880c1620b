// Vitest global setup: fail the whole run early, with install instructions, when redis-server is missing.
import { requireBinary } from './redis.js';

/** Checks that redis-server is on PATH. Each test file starts and stops its own servers (stopAll in afterAll), so there is no teardown. */
export default function setup(): void {
  requireBinary('redis-server');
}
