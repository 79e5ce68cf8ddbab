import type { ServerResponse } from 'node:http';
import { LogController, type FastifyReply, type FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import type { ApiError, RateLimit } from '../api/errors.js';
import { answeredStatus } from './metrics.js';

/**
 * The HTTP layer's logger and the request lines it writes (RequestLog): credentials never reach the log. Request lines show the URL without its
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

/**
 * Fastify's request serializer, but with the loggable URL, and the OpenAI SDKs' retry count where a
 * request is one: a retry of a request the client gave up on (its timeout) ran the work again, and the
 * count ties the two in the log.
 */
function requestSummary(request: FastifyRequest) {
  const retry = Number(request.headers['x-stainless-retry-count']);
  return {
    method: request.method,
    url: loggableUrl(request.url),
    host: request.host,
    remoteAddress: request.ip,
    remotePort: request.socket?.remotePort,
    ...(Number.isInteger(retry) && retry > 0 && { retry }),
  };
}

export function httpLogger(logger: Logger): Logger {
  return logger.child({}, { serializers: { req: requestSummary }, redact: { paths: REDACT_PATHS, censor: CENSORED } });
}

declare module 'fastify' {
  interface FastifyContextConfig {
    /** Polled by machines (probes, Prometheus): the request's own lines go out at debug level (see RequestLog). */
    polled?: boolean;
  }
}

/** The error each response was answered with (sendError), for its 'request completed' line. */
const answeredErrors = new WeakMap<ServerResponse, ApiError>();

/** Records that `response` answers with `error` (see RequestLog). */
export function answeredWithError(response: ServerResponse, error: ApiError): void {
  answeredErrors.set(response, error);
}

/**
 * What a log line says of an error answer: its code, and its param and limit where it has them. The
 * status alone does not tell an invalid_size 400 from an invalid_mask 400, nor a key over its
 * requests_per_minute from a full queue (both OpenAI's 429 `rate_limit_exceeded`: `limit` says which).
 * A param is short: the client's own text in one (an unknown field's name) is cut where the error is made.
 */
export function errorFields(error: ApiError): { code: string | null; param?: string; limit?: RateLimit } {
  return { code: error.code, ...(error.param !== null && { param: error.param }), ...(error.limit && { limit: error.limit }) };
}

/**
 * Fastify's request lines ('incoming request', 'request completed'), with two changes. A request the
 * server answered with an error says which (errorFields) on its 'request completed' line. And a polled
 * route's lines go out at debug level: Prometheus scrapes /metrics every 15 s and probes ask /health and
 * /ready every few seconds, which at info would fill the log with lines about nothing (LOG_LEVEL=debug shows them).
 */
export class RequestLog extends LogController {
  override incomingRequest(request: FastifyRequest): void {
    request.log[levelOf(request)]({ req: request }, 'incoming request');
  }

  override requestCompleted(error: Error | null | undefined, request: FastifyRequest, reply: FastifyReply): void {
    // A response that failed as it was written: Fastify's own line, at error level whatever the route.
    if (error) return super.requestCompleted(error, request, reply);
    const answered = answeredErrors.get(reply.raw);
    reply.log[levelOf(request)]({ res: reply, responseTime: reply.elapsedTime, ...(answered && errorFields(answered)) }, 'request completed');
  }

  /**
   * A streamed answer (server-sent events, a b64_json body) whose client left before its end has had
   * its line, shutdown.ts's 'request aborted' (counted as 499): Fastify's 'stream closed prematurely'
   * said it again, with the status 200 its headers had, which read as an answer delivered.
   */
  override streamError(error: Error, request: FastifyRequest, reply: FastifyReply): void {
    const clientLeft = (error as NodeJS.ErrnoException).code === 'ERR_STREAM_PREMATURE_CLOSE' && answeredStatus(reply.raw) === undefined;
    if (!clientLeft) super.streamError(error, request, reply);
  }
}

const levelOf = (request: FastifyRequest): 'debug' | 'info' => (request.routeOptions.config.polled ? 'debug' : 'info');
