import { isIPv4 } from 'node:net';
import type { FastifyRequest } from 'fastify';
import { ApiError } from '../api/errors.js';

/**
 * What a server without API keys answers: only clients on its own machine (config.ts lets it listen on
 * loopback only). Listening on loopback is not enough by itself, since other machines can reach a
 * loopback server through the machine's own programs:
 * - a web page of any site, through the browser of someone on the machine: by DNS rebinding (the page's
 *   own name made to point at 127.0.0.1, so the browser lets it read the answers), which the Host header
 *   gives away, or by posting a form (multipart/form-data needs no CORS preflight), which its Origin
 *   gives away. So the Host must name a loopback address (localhost, 127.0.0.0/8, [::1]) and a page's
 *   Origin must be one too, or one CORS_ORIGINS opens the server to;
 * - a reverse proxy on the machine, which brings every client it serves: its X-Forwarded-For or
 *   Forwarded header gives it away, and unless TRUST_PROXY says who the client behind it is (then that
 *   client must be on the machine), such a request is refused.
 * Each refusal is a 403 that says what to do instead.
 */

/** Proxies' headers for the client behind them that Fastify does not read (X-Forwarded-For it reads where TRUST_PROXY says). */
const UNREAD_FORWARDING = ['forwarded', 'x-real-ip'];

/** Whether a host name (no port; an IPv6 literal without brackets) names this machine's loopback. */
function isLoopbackName(name: string): boolean {
  const host = name.toLowerCase().replace(/\.$/, '');
  // RFC 6761: localhost and its subdomains resolve to loopback, as browsers make sure.
  if (host === 'localhost' || host.endsWith('.localhost')) return true;
  if (isIPv4(host)) return host.startsWith('127.');
  return host === '::1' || /^::ffff:127\./.test(host);
}

/**
 * Whether the client is a program on this machine: its address is loopback, and no proxy brought it
 * (a proxy's header for the client behind it is either absent, or X-Forwarded-For from a proxy that
 * TRUST_PROXY names, which Fastify then reads into request.ip: request.ips lists its entries after the
 * proxy's own address). Nothing here reads Forwarded or X-Real-IP.
 */
export function isLocalClient(request: FastifyRequest): boolean {
  const unread = UNREAD_FORWARDING.some((name) => request.headers[name] !== undefined);
  const unreadFor = request.headers['x-forwarded-for'] !== undefined && (request.ips?.length ?? 0) < 2;
  return !unread && !unreadFor && isLoopbackName(request.ip);
}

/** The name of a Host header or origin's host[:port] ("[::1]:8080" -> "::1"). */
const hostName = (host: string) => (host.startsWith('[') ? host.slice(1, host.indexOf(']')) : host.replace(/:\d*$/, ''));

const refused = (message: string) => new ApiError(403, message, { type: 'invalid_request_error', code: 'local_clients_only' });

/** The check a keyless server makes of every request; `corsOrigins` are the pages CORS_ORIGINS opened it to ("*": every page). */
export function localClientsOnly(corsOrigins: readonly string[]): (request: FastifyRequest) => Promise<void> {
  const anyPage = corsOrigins.includes('*');
  return async (request) => {
    if (!isLocalClient(request)) {
      throw refused(
        'This server has no API keys, so it answers only programs on its own machine, and this request came through a proxy that may serve others. ' +
          'Set API_KEYS (and TRUST_PROXY to the proxy, so that image URLs follow its X-Forwarded-Proto and X-Forwarded-Host).',
      );
    }
    const { host, origin } = request.headers;
    if (host !== undefined && !isLoopbackName(hostName(host))) {
      throw refused(
        `This server has no API keys, so it answers only programs on its own machine that address it as localhost, 127.0.0.1 or [::1]; this request names '${host}'. ` +
          'Use one of those names, or set API_KEYS to serve other names and machines.',
      );
    }
    if (origin !== undefined && !anyPage && !corsOrigins.includes(origin) && !(URL.canParse(origin) && isLoopbackName(hostName(new URL(origin).host)))) {
      throw refused(
        `This server has no API keys, so web pages of other sites may not use it; this request came from a page of '${origin}'. ` +
          'Add that origin to CORS_ORIGINS if you trust every visitor of it to use this server, or set API_KEYS.',
      );
    }
  };
}
