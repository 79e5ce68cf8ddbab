import { randomBytes } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import type { FastifyInstance } from 'fastify';
import fp from 'fastify-plugin';

/**
 * Request ids as OpenAI sends them (x-request-id: req_<hex>), echoing a client's own id so it can
 * correlate its logs with ours; the SDKs expose it as `err.requestID`. Fastify's logger tags every log
 * line of a request with this id.
 */

/** Printable and short: a client id ends up in our logs and headers. */
const CLIENT_ID = /^[A-Za-z0-9._:@/+=-]{1,128}$/;

/** Fastify's `genReqId`. */
export function requestId(req: IncomingMessage): string {
  const sent = req.headers['x-request-id'];
  if (typeof sent === 'string' && CLIENT_ID.test(sent)) return sent;
  return `req_${randomBytes(16).toString('hex')}`;
}

async function requestIdPlugin(app: FastifyInstance): Promise<void> {
  app.addHook('onSend', async (request, reply) => {
    reply.header('x-request-id', request.id);
    reply.header('openai-processing-ms', Math.round(reply.elapsedTime).toString());
  });
}

export const requestIds = fp(requestIdPlugin, { name: 'request-id' });
