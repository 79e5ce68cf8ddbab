import { isIPv6 } from 'node:net';
import { TLSSocket } from 'node:tls';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import fp from 'fastify-plugin';
import { ApiError } from '../api/errors.js';
import { parseUrl } from '../util/url.js';
import { sentMoreThanOnce } from './raw-headers.js';

/**
 * The Host header, and the origin image URLs are built from. Node's own check for a missing Host is
 * switched off (app.ts) because it answers a bare 400; here it is made in OpenAI's shape, and a Host
 * that is not `host[:port]`, or two Host headers, are refused too (RFC 9112 asks for a 400 in each
 * case), before the key is checked. X-Forwarded-Proto/-Host count only from proxies TRUST_PROXY names
 * (Fastify checks the peer's address); a forwarded value that is not http(s) or not `host[:port]` is
 * ignored, so a forged header can never turn an image URL into `javascript:`, a URL with userinfo, or
 * markup.
 */

/** host[:port]: a DNS name (underscores allowed, as in container names) or IPv4 address, or an IPv6 literal in brackets. */
const HOST_SYNTAX = /^(?:\[([0-9A-Fa-f:.]+)\]|[A-Za-z0-9_-]{1,63}(?:\.[A-Za-z0-9_-]{1,63})*\.?)(?::(\d{1,5}))?$/;
const MAX_HOST_LENGTH = 261; // 253 for the name, ":65535"
const PROTOCOLS = new Set(['http', 'https']);

/** The origin for a protocol and host, or undefined when either is not one an image URL may have. */
function originOf(protocol: string, host: string | undefined): string | undefined {
  const match = host === undefined || host.length > MAX_HOST_LENGTH ? null : HOST_SYNTAX.exec(host);
  if (!match || !PROTOCOLS.has(protocol)) return undefined;
  const [, ipv6, port] = match;
  if ((ipv6 !== undefined && !isIPv6(ipv6)) || (port !== undefined && (Number(port) < 1 || Number(port) > 65535))) return undefined;
  const url = `${protocol}://${host}`;
  // WHATWG URL parsing still refuses some names the syntax allows (an IPv4 address out of range).
  return parseUrl(url)?.origin;
}

/**
 * The origin this request reached: the trusted proxy's forwarded protocol and host when valid, else the
 * connection's protocol with the Host header, else (HTTP/1.0 sends no Host) the address the connection
 * came in on.
 */
export function requestOrigin(request: FastifyRequest): string {
  const own = request.socket instanceof TLSSocket ? 'https' : 'http';
  const forwarded = request.protocol.toLowerCase();
  const local = request.socket.localAddress ?? '127.0.0.1';
  const address = `${isIPv6(local) ? `[${local}]` : local}:${request.socket.localPort}`;
  return (
    originOf(forwarded, request.host) ??
    originOf(own, request.headers.host) ??
    originOf(own, address) ??
    `${own}://127.0.0.1:${request.socket.localPort}`
  );
}

/**
 * The connection is closed after the answer: a proxy in front may have read another Host, or framed the
 * stream differently, so what follows on it is not to be trusted.
 */
const refused = (message: string) => new ApiError(400, message, { code: 'invalid_host_header', headers: { connection: 'close' } });

async function hostPlugin(app: FastifyInstance): Promise<void> {
  app.addHook('onRequest', async (request) => {
    const { host } = request.headers;
    if (host === undefined && request.raw.httpVersion === '1.1') {
      throw refused('The request has no Host header, which HTTP/1.1 requires.');
    }
    if (host !== undefined && originOf('http', host) === undefined) {
      throw refused('The Host header is not a valid host[:port].');
    }
    // RFC 9112 asks for a 400.
    if (sentMoreThanOnce(request, 'host')) {
      throw refused('The request has more than one Host header; send one.');
    }
  });
}

export const hostCheck = fp(hostPlugin, { name: 'host' });
