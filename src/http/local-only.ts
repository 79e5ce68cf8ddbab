import type { FastifyRequest } from 'fastify';
import { ApiError } from '../api/errors.js';
import { isLoopbackAddress } from '../util/loopback.js';
import { parseUrl } from '../util/url.js';

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
 *   client must be on the machine), such a request is refused. So is one that carries only a proxy's
 *   X-Forwarded-Host or -Proto (an nginx block setting those alone): it names no client, and the Host it
 *   passes on is the client's own choice, so a loopback Host proves nothing there.
 * Each refusal is a 403 that says what to do instead.
 */

/** Proxies' headers for the client behind them that Fastify does not read (X-Forwarded-For it reads where TRUST_PROXY says). */
const UNREAD_FORWARDING = ['forwarded', 'x-real-ip'];

/** What a proxy says of the address its client used, without naming the client: with no X-Forwarded-For beside it, the client is unknown. */
const UNNAMED_CLIENT = ['x-forwarded-host', 'x-forwarded-proto'];

/** Whether a host[:port] (a Host header, an origin's host) names this machine's loopback, read as browsers read it. */
function namesLoopback(host: string): boolean {
  const url = parseUrl(`http://${host}`);
  if (!url) return false;
  const name = url.hostname.replace(/\.$/, '');
  // RFC 6761: localhost and its subdomains resolve to loopback, as browsers make sure.
  if (name === 'localhost' || name.endsWith('.localhost')) return true;
  return isLoopbackAddress(name.replace(/^\[(.*)\]$/, '$1'));
}

/** Whether a page's Origin header names this machine's loopback (a page served from it, as browsers read it). */
const loopbackOrigin = (origin: string): boolean => namesLoopback(parseUrl(origin)?.host ?? '');

/**
 * Whether the client is a program on this machine: its address is loopback, and no proxy brought it
 * from elsewhere. Of a proxy's headers for the client behind it, Fastify reads X-Forwarded-For from
 * the proxies TRUST_PROXY names (request.ips then lists the socket's peer and the entries it took, the
 * client last): every one of them must be loopback, since a client can write entries of its own in
 * front of those its proxy adds. Forwarded and X-Real-IP nothing here reads: they are refused, as is
 * X-Forwarded-Host or -Proto without an X-Forwarded-For naming the client.
 */
function isLocalClient(request: FastifyRequest): boolean {
  if (UNREAD_FORWARDING.some((name) => request.headers[name] !== undefined)) return false;
  if (request.headers['x-forwarded-for'] === undefined) {
    return isLoopbackAddress(request.ip) && !UNNAMED_CLIENT.some((name) => request.headers[name] !== undefined);
  }
  const hops = request.ips ?? [];
  return hops.length >= 2 && hops.every(isLoopbackAddress);
}

/**
 * Whether the client is a program on this machine (isLocalClient) that addresses the server by a
 * loopback name and is no web page of another site: what may read a keyless probe's details. A keyed
 * server answers any Host, so a page that rebinds its own name to 127.0.0.1 reaches it from the
 * machine's browser with a loopback address; its Host (or an Origin of another site) gives it away.
 */
export function isLocallyAddressed(request: FastifyRequest): boolean {
  const { host, origin } = request.headers;
  return isLocalClient(request) && (host === undefined || namesLoopback(host)) && (origin === undefined || loopbackOrigin(origin));
}

const refused = (message: string) => new ApiError(403, message, { type: 'invalid_request_error', code: 'local_clients_only' });

/**
 * The check a keyless server makes of every request; `corsOrigins` are the pages CORS_ORIGINS opened it
 * to, by name: "*" opens it to none (config.ts refuses it without keys, where it would open it to every page).
 */
export function localClientsOnly(corsOrigins: readonly string[]): (request: FastifyRequest) => Promise<void> {
  return async (request) => {
    if (!isLocalClient(request)) {
      throw refused(
        'This server has no API keys, so it answers only programs on its own machine, and this request came through a proxy that may serve others. ' +
          'Set API_KEYS (and TRUST_PROXY to the proxy, so that image URLs follow its X-Forwarded-Proto and X-Forwarded-Host).',
      );
    }
    const { host, origin } = request.headers;
    if (host !== undefined && !namesLoopback(host)) {
      throw refused(
        `This server has no API keys, so it answers only programs on its own machine that address it as localhost, 127.0.0.1 or [::1]; this request names '${host}'. ` +
          'Use one of those names, or set API_KEYS to serve other names and machines.',
      );
    }
    if (origin !== undefined && !corsOrigins.includes(origin) && !loopbackOrigin(origin)) {
      throw refused(
        `This server has no API keys, so web pages of other sites may not use it; this request came from a page of '${origin}'. ` +
          'Add that origin to CORS_ORIGINS if you trust every visitor of it to use this server, or set API_KEYS.',
      );
    }
  };
}
