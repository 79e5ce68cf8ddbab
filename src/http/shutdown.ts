import type { Socket } from 'node:net';
import type { FastifyInstance } from 'fastify';
import fp from 'fastify-plugin';
import { ApiError } from '../api/errors.js';
import { answeredStatus } from './metrics.js';

/**
 * Each request's lifetime, and graceful shutdown. Every request gets `request.cancellation`, a signal
 * that aborts when its client goes away before the answer was sent (so waiting work is dropped and
 * running work stops; the log says 'request aborted', as Fastify logs 'request completed' only for
 * answers it finished) or when shutdown stops waiting for it. Fastify's own `request.signal` will not
 * do: it follows the request stream's 'close', which Node emits as soon as a POST body has been read.
 *
 * Once close() starts, every answer closes its connection, and requests arriving on open keep-alive
 * connections get a retryable 503 in OpenAI's shape; requests in flight get `timeoutMs` to finish, then their signals abort with that same 503;
 * then every connection is closed, at the latest ANSWER_GRACE_MS later: an answer being written to a
 * client that stopped reading never ends by itself. Node only closes idle connections by itself, and counts a connection
 * that has not sent a request yet (browsers and HTTP clients open spare ones) as busy, which would hold
 * shutdown for a minute; one still in its TLS handshake it does not know of, nor close, and it held
 * shutdown for the handshake's timeout.
 */

declare module 'fastify' {
  interface FastifyRequest {
    /** Aborts when the client disconnects or shutdown gives up on this request; its reason is an ApiError. */
    cancellation: AbortSignal;
  }
}

/** How long requests cancelled at the deadline have to send their 503 before their connections are closed (deploy/ sizes stop grace periods by it). */
export const ANSWER_GRACE_MS = 2000;

export interface ShutdownOptions {
  /** How long close() lets requests in flight finish before cancelling them. */
  timeoutMs: number;
}

async function shutdownPlugin(app: FastifyInstance, { timeoutMs }: ShutdownOptions): Promise<void> {
  let closing = false;
  let deadline: NodeJS.Timeout | undefined;
  let lastCall: NodeJS.Timeout | undefined;
  const inFlight = new Set<AbortController>();
  // Every connection from the moment it is accepted: Node's closeAllConnections knows only those its HTTP
  // parser took, which over HTTPS is once their TLS handshake is done. One still in its handshake (a port
  // scan, a balancer's TCP check, a client that hung) held the close for the handshake's timeout.
  const sockets = new Set<Socket>();
  app.server.on('connection', (socket: Socket) => {
    sockets.add(socket);
    socket.once('close', () => sockets.delete(socket));
  });
  const closeAllConnections = () => {
    app.server.closeAllConnections();
    for (const socket of sockets) socket.destroy();
  };
  const closeConnectionsWhenDrained = () => {
    if (closing && inFlight.size === 0) closeAllConnections();
  };

  // Fastify takes the decoration's initial value as the property's type (AbortSignal); every request's own is set in onRequest, before anything reads it.
  app.decorateRequest('cancellation', null as unknown as AbortSignal);
  app.addHook('onRequest', async (request, reply) => {
    const lifetime = new AbortController();
    request.cancellation = lifetime.signal;
    inFlight.add(lifetime);
    // 'close' comes once per response: sent, failed or abandoned by the client.
    reply.raw.once('close', () => {
      inFlight.delete(lifetime);
      if (!reply.raw.writableFinished) {
        // A 408 errors.ts wrote for a body that did not come in time said so in the log: the client did not leave.
        if (answeredStatus(reply.raw) === undefined) request.log.info({ responseTime: reply.elapsedTime }, 'request aborted: the client closed the connection before the answer was sent');
        lifetime.abort(new ApiError(499, 'The client closed the connection.'));
      }
      closeConnectionsWhenDrained();
    });
    if (closing) throw ApiError.shuttingDown();
  });
  // An answer sent while closing ends its connection. Kept alive, the connection took its client's next
  // request only to answer it 503: a balancer's pool (HAProxy, nginx) sends that request on the idle
  // connection it holds to this replica, for the seconds its health checks take to see it gone, and
  // passes the 503 on rather than giving the request to another replica. Not while the request's body
  // is still arriving (a refused upload): closing on unread bytes resets the connection, and the client
  // would see a connection error, which the SDKs retry (openai-node 4 with an empty form), not the 503.
  app.addHook('onSend', async (request, reply) => {
    if (closing && request.raw.complete) reply.header('connection', 'close');
  });

  app.addHook('preClose', async () => {
    closing = true;
    closeConnectionsWhenDrained();
    if (inFlight.size === 0) return;
    app.log.info({ inFlight: inFlight.size, timeoutMs }, 'waiting for requests in flight to finish');
    deadline = setTimeout(() => {
      app.log.warn({ cancelled: inFlight.size }, 'shutdown deadline passed: cancelling the requests still in flight');
      for (const lifetime of inFlight) lifetime.abort(ApiError.shuttingDown());
      lastCall = setTimeout(() => {
        if (inFlight.size) app.log.warn({ closed: inFlight.size }, 'closing connections whose answers are still being written (clients that stopped reading)');
        closeAllConnections();
      }, ANSWER_GRACE_MS);
    }, timeoutMs);
  });

  app.addHook('onClose', async () => {
    clearTimeout(deadline);
    clearTimeout(lastCall);
  });
}

export const shutdown = fp(shutdownPlugin, { name: 'shutdown' });
