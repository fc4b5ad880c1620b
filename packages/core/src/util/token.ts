// Unguessable lease tokens, drawn from a pooled CSPRNG buffer so a hot acquire loop does not pay a syscall each time.
import { randomFillSync } from 'node:crypto';

const TOKEN_BYTES = 16; // 128 bits, as the contract requires
const POOL_SIZE = TOKEN_BYTES * 256;
const pool = Buffer.allocUnsafe(POOL_SIZE);
let offset = POOL_SIZE;

/** A fresh random token: 128 bits from the CSPRNG, base64url-encoded (22 characters). */
export function randomToken(): string {
  if (offset + TOKEN_BYTES > POOL_SIZE) {
    randomFillSync(pool);
    offset = 0;
  }
  const token = pool.toString('base64url', offset, offset + TOKEN_BYTES);
  offset += TOKEN_BYTES;
  return token;
}
