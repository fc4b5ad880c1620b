// Client-IP keys at the edges of the embedded-IPv4 forms, pinned after mutation testing (review 56) found them
// unguarded: group 4 decides NAT64 and IPv4-mapped, and a '::' standing for no group is not IPv6.
import { clientIpKey } from '@hasp/core/http';
import { expect, it } from 'vitest';

it('keys an address outside ::ffff:0:0/96 and 64:ff9b::/96 by its /64, though its last 32 bits look like IPv4', () => {
  // Group 4 is not 0: neither IPv4-mapped nor NAT64 well-known prefix.
  expect(clientIpKey('64:ff9b::1:0:102:304')).toBe('64:ff9b:0:0::/64');
  expect(clientIpKey('::1:ffff:1.2.3.4')).toBe('0:0:0:0::/64');
});

it("returns as given an address whose '::' stands for no group (nine groups: not an IPv6 address)", () => {
  expect(clientIpKey('1:2:3:4::5:6:7:8')).toBe('1:2:3:4::5:6:7:8');
});
