import { BlockList, isIPv4, isIPv6 } from 'node:net';

/** This machine's loopback addresses: 127.0.0.0/8 and ::1 (BlockList also matches their IPv4-mapped and long IPv6 forms). */
const LOOPBACK = new BlockList();
LOOPBACK.addSubnet('127.0.0.0', 8, 'ipv4');
LOOPBACK.addAddress('::1', 'ipv6');

/** Whether an IP address is a loopback one (anything else, a name included, is not). */
export function isLoopbackAddress(ip: string): boolean {
  const family = isIPv4(ip) ? 'ipv4' : isIPv6(ip) ? 'ipv6' : undefined;
  return family !== undefined && LOOPBACK.check(ip, family);
}
