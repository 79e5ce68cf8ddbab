import { STATUS_CODES } from 'node:http';
import type { Socket } from 'node:net';
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import fp from 'fastify-plugin';
import { ApiError } from '../api/errors.js';

/**
 * Every error leaves the server as an ApiError in OpenAI's shape: ours as thrown, Fastify's and Node's
 * HTTP parser's translated, anything else a 500 whose details go to the log only.
 */

const INTERNAL_ERROR_MESSAGE =
  'The server had an error while processing your request. Sorry about that! The server log has details under this request id.';

const METHODS = ['GET', 'HEAD', 'POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS'] as const;

/** Fastify's own errors (body parsing, routing) in OpenAI's terms. */
function fromFastifyError(err: FastifyError, request: FastifyRequest): ApiError | undefined {
  switch (err.code) {
    case 'FST_ERR_CTP_INVALID_JSON_BODY':
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
      return new ApiError(
        400,
        'We could not parse the JSON body of your request. The API expects a JSON object, but what was sent was not valid JSON.',
      );
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return new ApiError(413, `The request body is too large: the limit is ${request.routeOptions.bodyLimit} bytes.`, {
        code: 'request_too_large',
      });
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return new ApiError(
        415,
        `Unsupported content type: '${request.headers['content-type'] ?? '(none)'}'. This endpoint only accepts 'application/json' requests.`,
        { code: 'unsupported_media_type' },
      );
  }
  if (err.statusCode && err.statusCode >= 400 && err.statusCode < 500) return new ApiError(err.statusCode, err.message);
  return undefined;
}

function send(reply: FastifyReply, error: ApiError): FastifyReply {
  return reply.code(error.status).headers(error.headers).type('application/json; charset=utf-8').send(error.toBody());
}

/**
 * Fastify's `clientErrorHandler`: requests Node's HTTP parser rejects before any route sees them (headers
 * over 16 KiB, malformed request lines, unknown methods, raw null bytes in the URL). Written to the socket
 * by hand, as Node's own answer would be, but with OpenAI's error body.
 */
export function answerClientError(err: NodeJS.ErrnoException, socket: Socket): void {
  if (err.code === 'ECONNRESET' || socket.destroyed) return;
  const error =
    err.code === 'HPE_HEADER_OVERFLOW'
      ? new ApiError(431, 'The request headers are too large.', { code: 'request_header_fields_too_large' })
      : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
        ? new ApiError(408, 'The request took too long to arrive.', { code: 'request_timeout' })
        : new ApiError(400, 'The HTTP request is malformed and could not be parsed.', { code: 'malformed_request' });
  const body = JSON.stringify(error.toBody());
  if (socket.writable) {
    socket.write(
      `HTTP/1.1 ${error.status} ${STATUS_CODES[error.status]}\r\nContent-Type: application/json; charset=utf-8\r\n` +
        `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
    );
  }
  socket.destroy(err);
}

/** Fastify's `frameworkErrors`: URLs its router cannot decode (bad percent-encoding) or parameters over its length limit. */
export function answerFrameworkError(err: FastifyError, _request: FastifyRequest, reply: FastifyReply): FastifyReply {
  const tooLong = err.code === 'FST_ERR_MAX_PARAM_LENGTH';
  return send(
    reply,
    tooLong
      ? new ApiError(414, 'The URL is too long.', { code: 'uri_too_long' })
      : new ApiError(400, 'The URL is malformed: it has invalid percent-encoding.', { code: 'invalid_url' }),
  );
}

async function errorsPlugin(app: FastifyInstance): Promise<void> {
  app.setErrorHandler((err: FastifyError, request, reply) => {
    const error = err instanceof ApiError ? err : fromFastifyError(err, request);
    if (error && error.status < 500) return send(reply, error);
    request.log.error({ err }, 'request failed');
    return send(reply, error ?? new ApiError(500, INTERNAL_ERROR_MESSAGE));
  });

  // A known path with another method is a 405 naming the allowed ones, not a 404.
  app.setNotFoundHandler((request, reply) => {
    const path = request.url.split('?')[0];
    const allowed = METHODS.filter((method) => app.findRoute({ method, url: path }));
    if (allowed.length) {
      return send(
        reply,
        new ApiError(405, `Method ${request.method} is not allowed for ${path}. Allowed: ${allowed.join(', ')}.`, {
          code: 'method_not_allowed',
          headers: { allow: allowed.join(', ') },
        }),
      );
    }
    return send(reply, new ApiError(404, `Invalid URL (${request.method} ${path})`));
  });
}

export const errors = fp(errorsPlugin, { name: 'errors' });
