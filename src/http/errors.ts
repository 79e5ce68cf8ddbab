import { STATUS_CODES, type IncomingMessage, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest, HTTPMethods } from 'fastify';
import fp from 'fastify-plugin';
import { ApiError } from '../api/errors.js';
import { newRequestId, stampReply } from './request-id.js';
import { isLingering, keepOpenForRest } from './connections.js';
import { MAX_UPLOAD_BYTES } from './uploads.js';
import type { Metrics } from '../observability/metrics.js';
import { answeredAside, BEFORE_ROUTING } from './metrics.js';
import { answeredWithError, errorFields } from './logging.js';
import { requestOrigin } from './host.js';

/**
 * Every error leaves the server as an ApiError in OpenAI's shape: ours as thrown, Fastify's and Node's
 * HTTP parser's translated, anything else a 500 whose details go to the log only.
 */

const INTERNAL_ERROR_MESSAGE =
  'The server had an error while processing your request. Sorry about that! The server log has details under this request id.';

/**
 * The methods a 405 may name. Not OPTIONS: its only route is CORS's catch-all for preflights (cors.ts),
 * which matches every path and would turn every unknown URL's 404 into a 405.
 */
const METHODS = ['GET', 'HEAD', 'POST', 'PUT', 'DELETE', 'PATCH'] as const;

/** Whether the request's route also takes a multipart form: the edit routes' context parses forms (edits.ts). */
const takesForms = (request: FastifyRequest) => request.server.hasContentTypeParser('multipart/form-data');

/**
 * A body over BODY_LIMIT (as declared, as read, or as decompressed: `decompressed`). On the routes that
 * take forms, such a body is a picture sent as a data: URI in JSON (base64, a third larger than its
 * file), which a phone photo passes at the default limit: the answer says how to send it instead.
 */
export function bodyTooLarge(request: FastifyRequest, decompressed = false): ApiError {
  const advice = takesForms(request)
    ? ` Send the image as a multipart/form-data upload (what the SDKs send; up to ${MAX_UPLOAD_BYTES / 1024 ** 2} MiB a file) rather than as a data: URI in JSON, or raise the server's BODY_LIMIT.`
    : '';
  return new ApiError(413, `The request body is too large: the limit is ${request.routeOptions.bodyLimit} bytes${decompressed ? ', counted after decompression' : ''}.${advice}`, {
    code: 'request_too_large',
  });
}

/**
 * The 415 for a body the route does not take, naming the content types it does. Variations take no JSON
 * (formOnly), which Fastify parses for every route: a JSON body is refused with this too (edits.ts), and
 * their answer to another type does not name JSON, which would send the client to that refusal.
 */
export function unsupportedMediaType(request: FastifyRequest): ApiError {
  const accepted = request.routeOptions.config.formOnly ? "only 'multipart/form-data'" : takesForms(request) ? "'application/json' and 'multipart/form-data'" : "only 'application/json'";
  return new ApiError(415, `Unsupported content type: '${request.headers['content-type'] ?? '(none)'}'. This endpoint accepts ${accepted} requests.`, {
    code: 'unsupported_media_type',
  });
}

/** Fastify's own errors (body parsing, routing) in OpenAI's terms. */
function fromFastifyError(err: FastifyError, request: FastifyRequest): ApiError | undefined {
  switch (err.code) {
    case 'FST_ERR_CTP_INVALID_JSON_BODY':
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
      return new ApiError(
        400,
        // Fastify's parser (secure-json-parse) also refuses valid JSON with these keys, a guard against
        // prototype pollution, and does not say which it was.
        "We could not parse the JSON body of your request. The API expects a JSON object, but what was sent was not valid JSON, or had a '__proto__' or 'constructor' key, which this server refuses.",
      );
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return bodyTooLarge(request);
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return unsupportedMediaType(request);
  }
  if (err.statusCode && err.statusCode >= 400 && err.statusCode < 500) return new ApiError(err.statusCode, err.message);
  return undefined;
}

declare module 'fastify' {
  interface FastifyInstance {
    /** When each code of the server's own 5xx answers was last logged at error level (see logFailure). */
    failuresSaid: Map<string, number>;
    /** Where the answers written by hand (answerOnSocket) are counted, as every other request is (metrics.ts). */
    requestMetrics: Metrics;
  }
}

/** How long the log says a 5xx of the same code at info level after saying it at error level. */
const REPEATED_FAILURE_MS = 60_000;

/**
 * Logs a 5xx of the server's own (a damaged model, a full store, a queue timeout, a key's `concurrent`
 * limit): such a cause persists and every request meets it, so only the first of each code in a minute
 * goes out at error level with its cause; the others at info, each still saying what its request got. A
 * flood of requests (or one client over its own limit) cannot fill the log with the same error and stack.
 */
function logFailure(request: FastifyRequest, error: ApiError): void {
  const code = error.code ?? String(error.status);
  const said = request.server.failuresSaid;
  const now = performance.now();
  if (now - (said.get(code) ?? -Infinity) < REPEATED_FAILURE_MS) {
    request.log.info({ status: error.status, ...errorFields(error) }, `request failed (said at error level less than a minute ago): ${error.message}`);
    return;
  }
  said.set(code, now);
  request.log.error({ err: error }, 'request failed');
}

/**
 * A shutdown's 503 (a request cancelled at its deadline, or arriving during it) is the server doing what
 * it was told, not a failure: shutdown.ts warns once for all it cancels, and each request's own line
 * ('request completed', or a stream's 'stream ended with an error event') says its 503 at info. At error
 * level, every deploy whose requests outlast SHUTDOWN_TIMEOUT_SECONDS raised an alert with a stack trace.
 */
const isShutdownRefusal = (error: ApiError): boolean => error.code === 'server_shutting_down';

/**
 * What a failure is answered with, as a response or as a streamed error event: an ApiError as it is,
 * Fastify's own errors translated, anything else logged and answered with the generic 500.
 */
export function apiErrorOf(err: unknown, request: FastifyRequest): ApiError {
  const error = err instanceof ApiError ? err : err instanceof Error ? fromFastifyError(err as FastifyError, request) : undefined;
  if (error && (error.status < 500 || isShutdownRefusal(error))) return error;
  if (error) {
    logFailure(request, error);
    return error;
  }
  // Not one the server chose to give: a bug, logged every time.
  request.log.error({ err }, 'request failed');
  return new ApiError(500, INTERNAL_ERROR_MESSAGE);
}

/**
 * Sends an error in OpenAI's shape; the one way every route and hook answers with an error, so the one
 * place its 'request completed' line learns which error it was (logging.ts).
 */
export function sendError(reply: FastifyReply, error: ApiError): FastifyReply {
  answeredWithError(reply.raw, error);
  return reply.code(error.status).headers(error.headers).type('application/json; charset=utf-8').send(error.toBody());
}

/** What Node's HTTP parser and its timeouts refuse, in OpenAI's terms; `limits`: the server's timeouts (ms), which a 408 names. */
function fromClientError(err: NodeJS.ErrnoException, limits: { headersTimeout: number; requestTimeout: number }): ApiError {
  switch (err.code) {
    case 'HPE_HEADER_OVERFLOW':
      return new ApiError(431, 'The request headers are too large: the limit is 16 KiB.', { code: 'request_header_fields_too_large' });
    case 'ERR_SSL_HTTP_REQUEST':
      return new ApiError(400, 'The request came as plain HTTP to a port that serves HTTPS: use an https:// URL for this server.', { code: 'https_required' });
    case 'ERR_HTTP_REQUEST_TIMEOUT':
      // A slow link's large upload (an edit's image and mask of up to 50 MiB each) meets it first: the message says which settings to raise.
      return new ApiError(
        408,
        `The request took too long to arrive: its headers must be sent within ${limits.headersTimeout / 1000} s (the server's HEADERS_TIMEOUT_SECONDS) and all of it, body included, within ${limits.requestTimeout / 1000} s (REQUEST_TIMEOUT_SECONDS). ` +
          'Send a smaller image over a slow link, or have the server\'s REQUEST_TIMEOUT_SECONDS raised.',
        { code: 'request_timeout' },
      );
    default:
      return new ApiError(400, 'The HTTP request is malformed and could not be parsed.', { code: 'malformed_request' });
  }
}

/** Each routed request by its Node request (held no longer than that): what answerClientError answers may be one, awaiting its body. */
const routed = new WeakMap<IncomingMessage, FastifyRequest>();

/**
 * The TCP connection under a TLS socket that refused a plain HTTP request (HTTPS with TLS_CERT, asked
 * for with http://). The TLS layer is done with it, but the connection can still carry a plain answer
 * that says so, as nginx gives one: the client saw only a closed connection ("Connection error." from
 * the SDKs, "Empty reply from server" from curl, a balancer's 502). Only a request that arrived whole
 * reads the answer (a GET, a JSON body): the TLS layer closes the connection with the rest of a larger
 * body unread, which resets it under a client still uploading. Node keeps the connection as `_parent`
 * (undocumented); should a release not, it closes unanswered as before.
 */
function plainConnection(tlsSocket: Socket): Socket | undefined {
  return (tlsSocket as { _parent?: Socket })._parent;
}

/**
 * Fastify's `clientErrorHandler`: requests Node's HTTP parser rejects before any route sees them (headers
 * over 16 KiB, malformed request lines, unknown methods, raw null bytes in the URL), requests that
 * took longer than HEADERS_TIMEOUT_SECONDS / REQUEST_TIMEOUT_SECONDS to arrive, and plain HTTP on the
 * HTTPS port (plainConnection). Written to the socket by hand, as Node's own answer would be, but with
 * OpenAI's error body and a request id that the log line names too. The log gets Node's error code
 * (`clientError`) only: Node's parser errors carry the raw bytes of the request, API keys included.
 *
 * A request whose headers were routed but whose body did not come in time (a slow upload) is answered
 * under its own id (the client's x-request-id), logged on its own lines (with its key's label) and counted
 * in /metrics as the 408 it got: before, it got a fresh id, and its lines and metrics said the client left.
 */
export function answerClientError(this: FastifyInstance, err: NodeJS.ErrnoException, refused: Socket): void {
  const socket = err.code === 'ERR_SSL_HTTP_REQUEST' ? plainConnection(refused) : refused;
  if (err.code === 'ECONNRESET' || !socket || socket.destroyed) return;
  answerOnSocket(this, socket, fromClientError(err, this.server), { clientError: err.code });
  // The connection under a TLS socket is closed by the TLS layer as it goes: ended here after the
  // answer, with no 'error' event, which nobody listens for on it.
  if (socket === refused) socket.destroy(err);
  else socket.end();
}

/**
 * The answer to CONNECT (a client told to use this server as its proxy): Node hands such a request to
 * the server's 'connect' listeners only, and without one closes the socket unanswered, so the client
 * saw "socket hang up" rather than what is wrong. This server is no proxy: a 405 says so.
 */
function answerConnect(app: FastifyInstance, request: IncomingMessage, socket: Socket): void {
  // No one else listens on a socket handed to 'connect': a client that resets it must not end the process.
  socket.on('error', () => {});
  const error = new ApiError(405, `Method CONNECT is not allowed: this server is no proxy. Send requests to its own URLs (${request.url ?? ''} was asked for as a tunnel); check the client's proxy settings (HTTPS_PROXY).`, {
    code: 'method_not_allowed',
  });
  answerOnSocket(app, socket, error, { method: 'CONNECT' });
  socket.end();
}

/** What the log line of an answer written by hand says beside the error: the method where known, Node's error code where its parser refused. */
interface Refused {
  method?: string;
  clientError?: string;
}

/**
 * Writes `error` to a socket by hand, as Node's own answer would be, with a request id the log line names
 * too: the id of the routed request awaiting its body there, if any, else a new one.
 */
function answerOnSocket(app: FastifyInstance, socket: Socket, error: ApiError, refused: Refused): void {
  const pending = (socket as { _httpMessage?: ServerResponse | null })._httpMessage;
  const request = pending && routed.get(pending.req);
  const id = request?.id ?? newRequestId();
  const log = request?.log ?? app.log.child({ reqId: id });
  log.info({ status: error.status, ...errorFields(error), ...refused }, request ? 'request refused before its body arrived' : 'request refused before routing');
  const body = JSON.stringify(error.toBody());
  // An answer already under way on this connection (a response to a request whose body is late), or one
  // given before the body that is still being read (connections.ts), cannot take a second one.
  if (socket.writable && !isLingering(socket) && !pending?.headersSent) {
    // A routed request is counted by its own reply (metrics.ts); one that never was, here, with no
    // duration: when it began to arrive is not known. Its method neither, unless it is CONNECT's.
    if (pending) answeredAside(pending, error.status);
    else app.requestMetrics.httpRequest(refused.method ?? 'unknown', BEFORE_ROUTING, error.status);
    socket.write(
      `HTTP/1.1 ${error.status} ${STATUS_CODES[error.status]}\r\nContent-Type: application/json; charset=utf-8\r\n` +
        `Content-Length: ${Buffer.byteLength(body)}\r\nx-request-id: ${id}\r\nConnection: close\r\n\r\n${body}`,
    );
  }
}

/**
 * Fastify's `frameworkErrors`: URLs its router cannot decode (bad percent-encoding) or parameters over its
 * length limit. No route's hooks run for these, so the request id is stamped here.
 */
export function answerFrameworkError(err: FastifyError, request: FastifyRequest, reply: FastifyReply): FastifyReply {
  stampReply(request, reply);
  const tooLong = err.code === 'FST_ERR_MAX_PARAM_LENGTH';
  return sendError(
    reply,
    tooLong
      ? new ApiError(414, 'The URL is too long.', { code: 'uri_too_long' })
      : new ApiError(400, 'The URL is malformed: it has invalid percent-encoding.', { code: 'invalid_url' }),
  );
}

/**
 * The answer to a request no route takes: a 405 naming the allowed methods where the path is known, else
 * a 404. (One sent before its body arrived closes the connection, as every such answer does: connections.ts.)
 */
function unroutedError(app: FastifyInstance, request: FastifyRequest): ApiError {
  const path = request.url.split('?')[0];
  const allowed = METHODS.filter((method) => app.findRoute({ method, url: path }));
  if (allowed.length) {
    return new ApiError(405, `Method ${request.method} is not allowed for ${path}. Allowed: ${allowed.join(', ')}.`, {
      code: 'method_not_allowed',
      headers: { allow: allowed.join(', ') },
    });
  }
  // A base URL set without /v1 (http://host:8000), which clients written for servers that answer both
  // (LocalAI; Nextcloud's integration sends POST /images/generations) then use: OpenAI's bare 'Invalid
  // URL' left the user to guess what was wrong with a path the API has.
  const underV1 = `/v1${path}`;
  if (!path.startsWith('/v1/') && app.findRoute({ method: request.method as HTTPMethods, url: underV1 })) {
    return new ApiError(
      404,
      `${invalidUrl(request).message}: this server's API is under /v1 (${request.method} ${underV1}). Set the client's base URL with /v1 at its end, e.g. ${requestOrigin(request)}/v1.`,
    );
  }
  return invalidUrl(request);
}

/** OpenAI's answer to a URL it has no route for. */
export function invalidUrl(request: FastifyRequest): ApiError {
  return new ApiError(404, `Invalid URL (${request.method} ${request.url.split('?')[0]})`);
}

export interface ErrorsOptions {
  /** Counts the requests refused before routing, whose answers no reply sends. */
  metrics: Metrics;
}

async function errorsPlugin(app: FastifyInstance, { metrics }: ErrorsOptions): Promise<void> {
  app.decorate('failuresSaid', new Map<string, number>());
  app.decorate('requestMetrics', metrics);
  app.addHook('onRequest', async (request) => void routed.set(request.raw, request));
  app.server.on('connect', (request: IncomingMessage, socket: Socket) => answerConnect(app, request, socket));
  app.setErrorHandler((err: FastifyError, request, reply) => {
    keepOpenForRest(request, reply);
    return sendError(reply, apiErrorOf(err, request));
  });
  app.setNotFoundHandler((request, reply) => sendError(reply, unroutedError(app, request)));
}

export const errors = fp(errorsPlugin, { name: 'errors' });

/**
 * Answers a request no route takes as it arrives, key or no key: Fastify's not-found handler runs only
 * after the body was read, decompressed and parsed, which would let any client make the server do that
 * work for nothing. Registered after cors, so that pages can read the answer.
 */
async function unroutedPlugin(app: FastifyInstance): Promise<void> {
  app.addHook('onRequest', async (request) => {
    if (request.is404) throw unroutedError(app, request);
  });
}

export const unrouted = fp(unroutedPlugin, { name: 'unrouted' });
