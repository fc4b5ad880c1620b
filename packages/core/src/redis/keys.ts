// Maps user keys onto Redis keys that can never escape the prefix, collide, or straddle Cluster hash slots.
//
// Every Redis name for user key K is `${prefix}{${stored(K)}}${suffix}`, where stored(K) is encode(K), or for a long key
// a digest of it (storedKey). Neither ever holds '}', so the first '}' after the prefix always closes the hash tag: all
// names of one key share a slot whatever K contains, and no suffix of one key can be forged by another key. encode() is
// injective: it escapes '%' and '}' and spells out lone UTF-16 surrogates, which ioredis would otherwise turn into
// U+FFFD and so make distinct keys collide.
//
// Redis takes the hash tag from the FIRST '{' of a name and the first '}' after it, so a prefix holding a complete tag
// would decide the slot instead: `app{x}:` pins every key of every user to one slot (correct but one hot shard), and
// `app{}:` makes an empty tag, so each name hashes whole and one key's names land in different slots (CROSSSLOT on every
// lock script). A lone '{' keeps the slots right but makes names of different prefixes collide: key '{x' under prefix
// 'app' and key 'x' under prefix 'app{' are both `app{{x}`. So every constructor refuses a '{' anywhere in a prefix
// (checkPrefix), the token bucket too; then the first '{' of a name ends its prefix, and (prefix, key) pairs never share
// a name. A '}' is harmless and allowed.

import { createHash } from 'node:crypto';

/** An injective, `}`-free spelling of a user key. */
export function encodeKey(key: string): string {
  // Fast path: most keys need no escaping.
  if (!/[%}\uD800-\uDFFF]/.test(key)) return key;
  let out = '';
  for (let i = 0; i < key.length; i++) {
    const c = key.charCodeAt(i);
    if (c === 0x25) out += '%25';
    else if (c === 0x7d) out += '%7D';
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < key.length) {
      const d = key.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) {
        out += key[i]! + key[i + 1]!;
        i++;
      } else out += `%u${c.toString(16)}`;
    } else if (c >= 0xd800 && c <= 0xdfff) out += `%u${c.toString(16)}`;
    else out += key[i]!;
  }
  return out;
}

/**
 * Keys whose spelling is longer than this many characters are stored under a digest of it. A key often comes from the
 * client (a phone number from the body, an id from the URL): without a bound, each request could leave a key of its
 * body's size in Redis (a lock's fence key for an hour) or in the process.
 */
export const LONG_KEY_CHARS = 128;

/**
 * How a key is stored: {@link encodeKey}'s spelling, or for a long one `%#` and the base64url SHA-256 of that spelling
 * (45 characters). Injective: `%#` never begins an escape of encodeKey, which only writes `%25`, `%7D` and `%u…`.
 */
export function storedKey(key: string): string {
  const spelled = encodeKey(key);
  if (spelled.length <= LONG_KEY_CHARS) return spelled;
  return `%#${createHash('sha256').update(spelled).digest('base64url')}`;
}

/** The hash-tagged stem shared by every Redis name of `key`. */
export function keyStem(prefix: string, key: string): string {
  return `${prefix}{${storedKey(key)}}`;
}

/**
 * Validates a `prefix` option: any string without '{', which would open a Redis Cluster hash tag overriding the per-key
 * tag of {@link keyStem}, or let names of different prefixes collide.
 * @throws TypeError naming `prefix` for a non-string or a prefix holding '{'
 */
export function checkPrefix(prefix: unknown): string {
  if (typeof prefix !== 'string') throw new TypeError(`prefix must be a string, got ${typeof prefix}`);
  if (prefix.includes('{')) {
    throw new TypeError(
      `prefix must not contain '{': hasp puts each key in a Redis Cluster hash tag of its own, right after the prefix, ` +
        `got ${JSON.stringify(prefix.length > 40 ? `${prefix.slice(0, 37)}...` : prefix)}`,
    );
  }
  return prefix;
}

/** A name (a rate limiter's policy) spelled for use inside a prefix: {@link encodeKey}, and '{' escaped as well. */
export function encodePrefixPart(name: string): string {
  return encodeKey(name).replaceAll('{', '%7B');
}

/**
 * The Redis Cluster hash slot of a key name, as the server computes it: CRC16 (XMODEM) of its UTF-8 bytes, or of the
 * bytes between its first '{' and the first '}' after it when those enclose something, modulo 16384.
 */
export function hashSlot(name: string): number {
  let bytes = Buffer.from(name);
  const open = bytes.indexOf(0x7b);
  if (open >= 0) {
    const close = bytes.indexOf(0x7d, open + 1);
    if (close > open + 1) bytes = bytes.subarray(open + 1, close);
  }
  let crc = 0;
  for (const byte of bytes) {
    crc ^= byte << 8;
    for (let i = 0; i < 8; i++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff;
  }
  return crc % 16384;
}
