// clientIpKey(): the default rate-limit key for every spelling of a client address the frameworks can report.
import { clientIpKey, parseIPv6, UNKNOWN_CLIENT } from '@hasp/core/http';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';

describe('clientIpKey', () => {
  it.each([
    ['127.0.0.1', '127.0.0.1'],
    ['203.0.113.9', '203.0.113.9'],
    // IPv4-mapped IPv6 (a dual-stack socket reports IPv4 clients this way) is the IPv4 client.
    ['::ffff:127.0.0.1', '127.0.0.1'],
    ['::FFFF:203.0.113.9', '203.0.113.9'],
    ['::ffff:7f00:1', '127.0.0.1'],
    ['0:0:0:0:0:ffff:cb00:7109', '203.0.113.9'],
    // IPv6 by /64, whatever the spelling.
    ['::1', '0:0:0:0::/64'],
    ['::', '0:0:0:0::/64'],
    ['2001:db8::1', '2001:db8:0:0::/64'],
    ['2001:0DB8:0001:0002:0003:0004:0005:0006', '2001:db8:1:2::/64'],
    ['2001:db8:1:2::', '2001:db8:1:2::/64'],
    ['2001:db8:1:2:ffff:ffff:ffff:ffff', '2001:db8:1:2::/64'],
    ['fe80::1%eth0', 'fe80:0:0:0::/64'],
    ['[2001:db8:1:2::7]', '2001:db8:1:2::/64'],
    // An IPv4 client through a NAT64 translator (RFC 6052's well-known prefix) is the IPv4 client too, not one /64
    // shared by every IPv4 client; other addresses of the prefix's /64 and the local-use 64:ff9b:1::/48 are IPv6.
    ['64:ff9b::192.0.2.33', '192.0.2.33'],
    ['64:FF9B:0:0:0:0:c000:221', '192.0.2.33'],
    ['64:ff9b::1:c000:221', '64:ff9b:0:0::/64'],
    ['64:ff9b:1::192.0.2.33', '64:ff9b:1:0::/64'],
    // A port, as some proxies forward it in X-Forwarded-For: the client, not the connection.
    ['203.0.113.9:51234', '203.0.113.9'],
    ['[2001:db8:1:2::7]:443', '2001:db8:1:2::/64'],
    ['[::ffff:203.0.113.9]:8080', '203.0.113.9'],
  ])('keys %s as %s', (ip, key) => {
    expect(clientIpKey(ip)).toBe(key);
  });

  it('keys a missing address as one shared "unknown" client', () => {
    expect(UNKNOWN_CLIENT).toBe('unknown');
    for (const missing of [undefined, null, '']) expect(clientIpKey(missing)).toBe('unknown');
  });

  it.each(['not-an-ip', '1:2:3', ':::', '1::2::3', '12345::', '::ffff:1.2.3.256', '1:2:3:4:5:6:7:8:9', '::ffff:1.2.3'])(
    'returns %s (not an address) as given',
    (garbage) => {
      expect(parseIPv6(garbage)).toBeUndefined();
      expect(clientIpKey(garbage)).toBe(garbage);
    },
  );

  const group = fc.integer({ min: 0, max: 0xffff });
  const groups = fc.array(group, { minLength: 8, maxLength: 8 });
  const full = (g: number[]) => g.map((x) => x.toString(16)).join(':');

  it('gives every address of one /64 the same key, and addresses of different /64s different keys', () => {
    fc.assert(
      fc.property(groups, groups, (a, b) => {
        // Leave the IPv4-mapped and NAT64 ranges out: they are keyed as IPv4.
        const v4 = (g: number[]) => g.slice(2, 5).every((x) => x === 0) && ((g[0] === 0 && g[1] === 0 && g[5] === 0xffff) || (g[0] === 0x64 && g[1] === 0xff9b && g[5] === 0));
        fc.pre(!v4(a) && !v4(b));
        const sameNet = [...a.slice(0, 4), ...b.slice(4)];
        expect(clientIpKey(full(a))).toBe(clientIpKey(full(sameNet)));
        const differ = a.slice(0, 4).some((x, i) => x !== b[i]);
        expect(clientIpKey(full(a)) === clientIpKey(full(b))).toBe(!differ);
      }),
      { numRuns: 500 },
    );
  });

  it('reads every compressed spelling of an address as the full one', () => {
    fc.assert(
      fc.property(groups, fc.integer({ min: 0, max: 7 }), fc.integer({ min: 1, max: 8 }), (g, start, len) => {
        const zeroed = g.map((x, i) => (i >= start && i < start + len ? 0 : x));
        const end = Math.min(8, start + len);
        const head = zeroed.slice(0, start).map((x) => x.toString(16)).join(':');
        const tail = zeroed.slice(end).map((x) => x.toString(16)).join(':');
        expect(parseIPv6(`${head}::${tail}`)).toEqual(zeroed);
        expect(parseIPv6(full(zeroed).toUpperCase())).toEqual(zeroed);
      }),
      { numRuns: 500 },
    );
  });
});
