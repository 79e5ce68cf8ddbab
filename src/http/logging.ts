import type { FastifyRequest } from 'fastify';
import type { Logger } from 'pino';

/**
 * The HTTP layer's logger: credentials never reach the log. Request lines show the URL without its
 * query string's content (no route of this API takes one, so what a client puts there, such as an
 * `?api_key=`, is noise at best and a secret at worst), and credential headers are censored wherever a
 * log line carries headers.
 */

const CENSORED = '[redacted]';

/** Header names that carry credentials, as paths pino censors at the top level and one level down. */
const CREDENTIAL_HEADERS = ['authorization', 'proxy-authorization', 'cookie', 'x-api-key', 'api-key'];
const REDACT_PATHS = CREDENTIAL_HEADERS.flatMap((name) => [`headers["${name}"]`, `*.headers["${name}"]`]);

/** The URL as it may be logged: the path, and a query string reduced to a marker. */
function loggableUrl(url: string): string {
  const query = url.indexOf('?');
  return query < 0 ? url : `${url.slice(0, query)}?${CENSORED}`;
}

/** Fastify's request serializer, but with the loggable URL. */
function requestSummary(request: FastifyRequest) {
  return { method: request.method, url: loggableUrl(request.url), host: request.host, remoteAddress: request.ip, remotePort: request.socket?.remotePort };
}

export function httpLogger(logger: Logger): Logger {
  return logger.child({}, { serializers: { req: requestSummary }, redact: { paths: REDACT_PATHS, censor: CENSORED } });
}
