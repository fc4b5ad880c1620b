// Option errors of the middleware factories: the same TypeError/RangeError core throws, prefixed with the factory's name.

/**
 * Runs `resolve` and prefixes the message of any TypeError or RangeError it throws with `where`, keeping the class,
 * so `rateLimit({ capacity: 5, rate: 0 })` fails with `RangeError: rateLimit: rate must be a finite number > 0, got 0`.
 */
export function optionErrors<T>(where: string, resolve: () => T): T {
  try {
    return resolve();
  } catch (error) {
    if (error instanceof RangeError) throw new RangeError(`${where}: ${error.message}`);
    if (error instanceof TypeError) throw new TypeError(`${where}: ${error.message}`);
    throw error;
  }
}

/** Rejects option names the caller misspelled (`{ capcity: 5 }`), naming the option and the valid ones. */
export function checkOptionNames(options: object, allowed: readonly string[]): void {
  for (const name of Object.keys(options)) {
    if (!allowed.includes(name)) throw new TypeError(`unknown option "${name}" (expected one of: ${allowed.join(', ')})`);
  }
}
