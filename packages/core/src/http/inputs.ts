// Calling the user's key and cost functions per request: sync or async, and anything but a usable value becomes a 500
// (through the app's error handling) before anything is written to a store.
import { describe } from '../util/validate.js';
import { invalidInputError } from './errors.js';

/** A per-request key: a string, `undefined` to skip, or a promise of either. */
export type KeyFunction<Arg> = (arg: Arg) => string | undefined | Promise<string | undefined>;

/** A per-request cost: a positive number, or a promise of one. */
export type CostFunction<Arg> = (arg: Arg) => number | Promise<number>;

function isThenable(value: unknown): value is PromiseLike<unknown> {
  return typeof value === 'object' && value !== null && typeof (value as { then?: unknown }).then === 'function';
}

function checkKey(where: string, value: unknown): string | undefined {
  if (typeof value === 'string' && value.length > 0) return value;
  if (value === undefined) return undefined;
  throw invalidInputError('INVALID_KEY', `${where}: the key function must return a non-empty string or undefined, got ${describe(value)}`);
}

/**
 * Calls a key function. Returns the key (or `undefined`: skip) directly when the function is synchronous, a promise
 * otherwise.
 * @throws (or rejects with) a 500 `http-errors` error, code `INVALID_KEY`, when the function throws or returns anything
 *   but a non-empty string or `undefined`
 */
export function callKey<Arg>(where: string, fn: KeyFunction<Arg>, arg: Arg): string | undefined | Promise<string | undefined> {
  let out: unknown;
  try {
    out = fn(arg);
  } catch (error) {
    throw invalidInputError('INVALID_KEY', `${where}: the key function threw: ${messageOf(error)}`, error);
  }
  if (!isThenable(out)) return checkKey(where, out);
  return Promise.resolve(out).then(
    (value) => checkKey(where, value),
    (error: unknown) => {
      throw invalidInputError('INVALID_KEY', `${where}: the key function rejected: ${messageOf(error)}`, error);
    },
  );
}

function checkCost(where: string, value: unknown, capacity: number): number {
  if (typeof value === 'number' && value > 0 && value <= capacity && Number.isFinite(value)) return value;
  throw invalidInputError(
    'INVALID_COST',
    `${where}: the cost function must return a finite number > 0 and <= the capacity ${capacity}, got ${describe(value)}`,
  );
}

/**
 * Calls a cost function; like {@link callKey}, sync results stay sync.
 * @throws (or rejects with) a 500 `http-errors` error, code `INVALID_COST`, when it throws or returns anything but a
 *   finite number in (0, capacity]
 */
export function callCost<Arg>(where: string, fn: CostFunction<Arg>, arg: Arg, capacity: number): number | Promise<number> {
  let out: unknown;
  try {
    out = fn(arg);
  } catch (error) {
    throw invalidInputError('INVALID_COST', `${where}: the cost function threw: ${messageOf(error)}`, error);
  }
  if (!isThenable(out)) return checkCost(where, out, capacity);
  return Promise.resolve(out).then(
    (value) => checkCost(where, value, capacity),
    (error: unknown) => {
      throw invalidInputError('INVALID_COST', `${where}: the cost function rejected: ${messageOf(error)}`, error);
    },
  );
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : describe(error);
}
