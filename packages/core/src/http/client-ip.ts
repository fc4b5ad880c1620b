// The default rate-limit key: the client IP as the framework reports it, with IPv4-mapped IPv6 addresses turned back
// into IPv4 and IPv6 addresses grouped by their /64 prefix (one customer site usually holds a whole /64).
// Translated IPv4 clients (the NAT64 well-known prefix 64:ff9b::/96, which a server behind a stateless translator sees
// every IPv4 client under) are keyed by their IPv4 address too: grouped by /64 they would all share one bucket.

/** The key used when the framework cannot say who the client is (e.g. the socket is already gone). */
export const UNKNOWN_CLIENT = 'unknown';

/**
 * The rate-limit key for a client address: IPv4 unchanged; `::ffff:a.b.c.d` and `64:ff9b::a.b.c.d` (and their hex
 * spellings) as `a.b.c.d`;
 * other IPv6 addresses as their /64 prefix, e.g. `2001:db8:1:2::/64`; a missing address as `'unknown'`, so
 * requests whose address cannot be read share one bucket instead of escaping the limit. Strings that are not IP
 * addresses (a proxy header's garbage, with `trust proxy` on) are returned as given. A port after the address
 * (`a.b.c.d:port`, `[v6]:port`, as some proxies forward it) is dropped.
 */
export function clientIpKey(ip: string | undefined | null): string {
  if (typeof ip !== 'string' || ip.length === 0) return UNKNOWN_CLIENT;
  // Fast path: IPv4 (the common case) has no colon.
  if (ip.indexOf(':') === -1) return ip;
  // Second fast path: an IPv4 client of a dual-stack server, as Node reports it ('::ffff:a.b.c.d').
  if (ip.startsWith('::ffff:')) {
    const m = IPV4.exec(ip.slice(7));
    if (m) {
      const a = Number(m[1]);
      const b = Number(m[2]);
      const c = Number(m[3]);
      const d = Number(m[4]);
      if (a <= 255 && b <= 255 && c <= 255 && d <= 255) return `${a}.${b}.${c}.${d}`;
      return ip;
    }
  }
  // Some proxies (Azure's among them) forward the client's port too, `a.b.c.d:port` or `[v6]:port`: keyed as given,
  // every connection of a client would have a bucket of its own.
  const v4 = IPV4_PORT.exec(ip);
  if (v4) return v4[1]!;
  const v6 = IPV6_PORT.exec(ip);
  if (v6) return clientIpKey(v6[1]);
  const groups = parseIPv6(ip);
  if (groups === undefined) return ip;
  const mapped = groups[0] === 0 && groups[1] === 0 && groups[5] === 0xffff;
  const translated = groups[0] === 0x64 && groups[1] === 0xff9b && groups[5] === 0;
  if ((mapped || translated) && groups[2] === 0 && groups[3] === 0 && groups[4] === 0) {
    const hi = groups[6]!;
    const lo = groups[7]!;
    return `${hi >> 8}.${hi & 0xff}.${lo >> 8}.${lo & 0xff}`;
  }
  return `${groups[0]!.toString(16)}:${groups[1]!.toString(16)}:${groups[2]!.toString(16)}:${groups[3]!.toString(16)}::/64`;
}

const HEX_GROUP = /^[0-9a-f]{1,4}$/i;
const IPV4 = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/;
const IPV4_PORT = /^(\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}):\d{1,5}$/;
const IPV6_PORT = /^\[([^\]]+)\]:\d{1,5}$/;

/** The eight 16-bit groups of an IPv6 address (zone id dropped, embedded IPv4 allowed), or undefined when invalid. */
export function parseIPv6(input: string): number[] | undefined {
  let ip = input;
  const zone = ip.indexOf('%');
  if (zone !== -1) ip = ip.slice(0, zone);
  if (ip.startsWith('[') && ip.endsWith(']')) ip = ip.slice(1, -1);
  const halves = ip.split('::');
  if (halves.length > 2) return undefined;
  const head = halves[0] === '' ? [] : halves[0]!.split(':');
  const tail = halves.length === 2 ? (halves[1] === '' ? [] : halves[1]!.split(':')) : [];
  const parts = halves.length === 2 ? tail : head;
  const groups: number[] = [];
  const push = (list: string[], allowIPv4Last: boolean): boolean => {
    for (let i = 0; i < list.length; i++) {
      const part = list[i]!;
      if (allowIPv4Last && i === list.length - 1 && part.includes('.')) {
        const m = IPV4.exec(part);
        if (!m) return false;
        const b = [Number(m[1]), Number(m[2]), Number(m[3]), Number(m[4])];
        if (b.some((x) => x > 255)) return false;
        groups.push((b[0]! << 8) | b[1]!, (b[2]! << 8) | b[3]!);
      } else {
        if (!HEX_GROUP.test(part)) return false;
        groups.push(parseInt(part, 16));
      }
    }
    return true;
  };
  if (halves.length === 1) {
    if (!push(parts, true) || groups.length !== 8) return undefined;
    return groups;
  }
  if (!push(head, false)) return undefined;
  const before = groups.length;
  if (!push(tail, true)) return undefined;
  const after = groups.splice(before);
  const fill = 8 - before - after.length;
  if (fill < 1) return undefined;
  for (let i = 0; i < fill; i++) groups.push(0);
  groups.push(...after);
  return groups;
}
