import type { FastifyInstance } from 'fastify';
import fp from 'fastify-plugin';
import { ApiError } from './errors.js';

/**
 * Graceful shutdown: once close() starts, requests arriving on open keep-alive connections get a
 * retryable 503 in OpenAI's shape; requests in flight finish; then every connection is closed. Node
 * only closes idle connections by itself, and counts a connection that has not sent a request yet
 * (browsers and HTTP clients open spare ones) as busy, which would hold shutdown for a minute.
 */

async function shutdownPlugin(app: FastifyInstance): Promise<void> {
  let closing = false;
  let inFlight = 0;
  const closeConnectionsWhenDrained = () => {
    if (closing && inFlight === 0) app.server.closeAllConnections();
  };

  app.addHook('onRequest', async (_request, reply) => {
    inFlight++;
    // 'close' comes once per response: sent, failed or abandoned by the client.
    reply.raw.once('close', () => {
      inFlight--;
      closeConnectionsWhenDrained();
    });
    if (closing) throw ApiError.shuttingDown();
  });

  app.addHook('preClose', async () => {
    closing = true;
    closeConnectionsWhenDrained();
  });
}

export const shutdown = fp(shutdownPlugin, { name: 'shutdown' });
