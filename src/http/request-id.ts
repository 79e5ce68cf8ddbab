import { randomBytes } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import fp from 'fastify-plugin';

/**
 * Request ids as OpenAI sends them (x-request-id: req_<hex>), echoing a client's own id so it can
 * correlate its logs with ours; the SDKs expose it as `err.requestID`. Fastify's logger tags every log
 * line of a request with this id.
 */

/** Printable and short: a client id ends up in our logs and headers. */
const CLIENT_ID = /^[A-Za-z0-9._:@/+=-]{1,128}$/;

/** A fresh id, as OpenAI's look. */
export const newRequestId = (): string => `req_${randomBytes(16).toString('hex')}`;

/** Fastify's `genReqId`. */
export function requestId(req: IncomingMessage): string {
  const sent = req.headers['x-request-id'];
  return typeof sent === 'string' && CLIENT_ID.test(sent) ? sent : newRequestId();
}

/** The API version OpenAI's answers name in `openai-version`, whose wire format ours follows. */
const OPENAI_VERSION = '2020-10-01';

/** OpenAI's response headers: the request id, the time taken and the API version. */
export function stampReply(request: FastifyRequest, reply: FastifyReply): void {
  reply.header('x-request-id', request.id);
  reply.header('openai-processing-ms', Math.round(reply.elapsedTime).toString());
  reply.header('openai-version', OPENAI_VERSION);
}

async function requestIdPlugin(app: FastifyInstance): Promise<void> {
  app.addHook('onSend', async (request, reply) => stampReply(request, reply));
}

export const requestIds = fp(requestIdPlugin, { name: 'request-id' });
