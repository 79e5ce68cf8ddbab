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
 * Once an answer is under way, a client that takes none of it for SEND_TIMEOUT_SECONDS is cut off: one
 * that never reads would hold the socket and the answer's buffers for good. The clock starts with the
 * answer, not the request, so a long generation is not cut short (a stream's keep-alive lines reach a
 * client that reads). Nor may a client trickle: one that takes a little now and then resets that
 * clock, so while part of the answer waits to go, each SEND_TIMEOUT_SECONDS must see at least
 * SEND_MIN_RATE bytes a second of it taken, or the connection is cut (a 70 MB b64_json answer stayed in memory for as
 * long as its client took 256 KiB every 45 s). A stream waiting for its next event has nothing waiting.
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

export interface ConnectionsOptions {
  sendTimeoutSeconds: number;
  /** SEND_MIN_RATE: bytes per second; 0 for none. */
  sendMinRate: number;
}

async function connectionsPlugin(app: FastifyInstance, { sendTimeoutSeconds, sendMinRate }: ConnectionsOptions): Promise<void> {
  app.addHook('onSend', async (request, reply) => {
    if (!request.raw.complete) reply.header('connection', 'close');
    // The socket's inactivity timer: any byte the client takes restarts it. Node replaces it with the
    // keep-alive timeout once the answer is done.
    reply.raw.setTimeout(sendTimeoutSeconds * 1000, () => {
      request.log.warn({ sendTimeoutSeconds }, 'the client took none of its answer for SEND_TIMEOUT_SECONDS: connection closed');
      reply.raw.destroy();
    });
    const socket = reply.raw.socket;
    if (!socket || sendMinRate === 0) return;
    let sentBefore = socket.bytesWritten;
    const check = setInterval(() => {
      const sent = socket.bytesWritten - sentBefore;
      sentBefore = socket.bytesWritten;
      // writableLength: what the answer has queued that the socket has not taken yet.
      if (reply.raw.writableLength === 0 || sent >= sendMinRate * sendTimeoutSeconds) return;
      request.log.warn({ sendTimeoutSeconds, sendMinRate, bytesTaken: sent }, 'the client took less than SEND_MIN_RATE of its answer over SEND_TIMEOUT_SECONDS: connection closed');
      reply.raw.destroy();
    }, sendTimeoutSeconds * 1000);
    reply.raw.once('close', () => clearInterval(check));
  });
}

export const connections = fp(connectionsPlugin, { name: 'connections' });
