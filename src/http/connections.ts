import type { ServerOptions } from 'node:http';
import type { FastifyInstance } from 'fastify';
import fp from 'fastify-plugin';
import type { Config } from '../config.js';

/**
 * How long a connection may take, and when it ends. Node's limits count only while a request is
 * arriving: HEADERS_TIMEOUT_SECONDS for its headers (also a new connection's first request, so a
 * connection that sends nothing is closed too), REQUEST_TIMEOUT_SECONDS for headers and body; past
 * either the client gets a 408 (errors.ts) and the connection is closed. Once the body is in, nothing
 * here limits the generation, however long it runs. Idle keep-alive connections close after
 * KEEP_ALIVE_TIMEOUT_SECONDS. Fastify's default requestTimeout of 0 would switch Node's limit off.
 *
 * An answer sent before the request's body was read (a refused key, an unknown URL, a body too large)
 * closes the connection: reading a body nobody wants would let a client hold the connection with it.
 */

export type ConnectionSettings = Pick<Config, 'headersTimeoutSeconds' | 'requestTimeoutSeconds' | 'keepAliveTimeoutSeconds'>;

/** Node checks its timeouts this often (its default, 30 s, would let a connection overstay by that). */
const CHECK_INTERVAL_MS = 1000;

/** Fastify's options for the limits, and Node's (`http`, which an HTTPS server takes among its TLS options). */
export function connectionOptions(settings: ConnectionSettings): { keepAliveTimeout: number; requestTimeout: number; http: ServerOptions } {
  const requestTimeout = settings.requestTimeoutSeconds * 1000;
  return {
    keepAliveTimeout: settings.keepAliveTimeoutSeconds * 1000,
    requestTimeout,
    http: {
      headersTimeout: settings.headersTimeoutSeconds * 1000,
      requestTimeout,
      connectionsCheckingInterval: CHECK_INTERVAL_MS,
      // host.ts answers a missing Host in OpenAI's shape; Node's own check sends a bare 400.
      requireHostHeader: false,
    },
  };
}

async function connectionsPlugin(app: FastifyInstance): Promise<void> {
  app.addHook('onSend', async (request, reply) => {
    if (!request.raw.complete) reply.header('connection', 'close');
  });
}

export const connections = fp(connectionsPlugin, { name: 'connections' });
