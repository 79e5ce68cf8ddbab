import type { IncomingMessage, ServerOptions, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { TlsOptions } from 'node:tls';
import { finished } from 'node:stream';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import fp from 'fastify-plugin';
import type { Config } from '../config.js';
import { plural } from '../util/plural.js';
import { sendsForm } from './raw-headers.js';

/**
 * How long a connection may take, and when it ends. Node's limits count only while a request is
 * arriving: HEADERS_TIMEOUT_SECONDS for its headers (also a new connection's first request, so a
 * connection that sends nothing is closed too), REQUEST_TIMEOUT_SECONDS for headers and body; past
 * either the client gets a 408 (errors.ts) and the connection is closed. Once the body is in, nothing
 * here limits the generation, however long it runs. Idle keep-alive connections close after
 * KEEP_ALIVE_TIMEOUT_SECONDS. Fastify's default requestTimeout of 0 would switch Node's limit off.
 *
 * An answer sent before the request's body was read (a refused key, an unknown URL, a full queue) goes
 * out at once, and the rest of the body is then read and dropped (up to LINGER_MAX_BYTES, within
 * REQUEST_TIMEOUT_SECONDS as any body), as nginx's lingering close does: a client still sending it,
 * as the OpenAI SDKs do (their fetch reads the answer only once the upload is done), would otherwise
 * have its upload reset and report a connection error (and retry it) instead of the 401 or 429. A body
 * declared longer than that, or one an answer closes on purpose (`connection: close`: a form past its
 * bound, a Host in doubt), is not read: the connection closes after the answer.
 * Once an answer is under way, a client that takes none of it for SEND_TIMEOUT_SECONDS is cut off: one
 * that never reads would hold the socket and the answer's buffers for good. The clock starts with the
 * answer, not the request, so a long generation is not cut short (a stream's keep-alive lines reach a
 * client that reads). Nor may a client trickle: while part of the answer waits to go, each
 * SEND_TIMEOUT_SECONDS must see at least SEND_MIN_RATE bytes a second of it taken, or the connection is
 * cut (a 70 MB b64_json answer stayed in memory for as long as its client took 256 KiB every 45 s). A
 * stream waiting for its next event has nothing waiting. These bound each answer in time; what all the
 * answers waiting for their clients hold together, ANSWER_MEMORY bounds (answer-memory.ts).
 */

export type ConnectionSettings = Pick<Config, 'headersTimeoutSeconds' | 'requestTimeoutSeconds' | 'keepAliveTimeoutSeconds'>;

/** Node checks its timeouts this often (its default, 30 s, would let a connection overstay by that). */
const CHECK_INTERVAL_MS = 1000;

/**
 * Every client connection sends TCP keep-alive probes after this long without traffic. A plain (not
 * streamed) request's connection carries nothing while its images are made, minutes on a CPU, and
 * load balancers and NATs that forward TCP (AWS's NLB after 350 s, Azure's load balancer after 4
 * minutes) drop a flow idle longer than their timeout, which a probe resets: its client then waited
 * for an answer that could never come. A probe also finds a client whose machine went away without
 * closing (asleep, off the network) once the system's probes go unanswered, and its work is cancelled.
 */
const TCP_KEEP_ALIVE_MS = 60_000;

/**
 * Fastify's options for the limits, and Node's (`http`, which an HTTPS server takes among its TLS options,
 * with `handshakeTimeout`).
 */
export function connectionOptions(settings: ConnectionSettings): { keepAliveTimeout: number; requestTimeout: number; http: ServerOptions & Pick<TlsOptions, 'handshakeTimeout'> } {
  const requestTimeout = settings.requestTimeoutSeconds * 1000;
  const headersTimeout = settings.headersTimeoutSeconds * 1000;
  return {
    keepAliveTimeout: settings.keepAliveTimeoutSeconds * 1000,
    requestTimeout,
    http: {
      headersTimeout,
      requestTimeout,
      connectionsCheckingInterval: CHECK_INTERVAL_MS,
      keepAlive: true,
      keepAliveInitialDelay: TCP_KEEP_ALIVE_MS,
      // host.ts answers a missing Host in OpenAI's shape; Node's own check sends a bare 400.
      requireHostHeader: false,
      // Over HTTPS Node's HTTP limits start only once the TLS handshake is done: a connection that sent
      // nothing, or half a ClientHello, was held for the handshake's own 120 s default, four times
      // HEADERS_TIMEOUT_SECONDS. The handshake gets that limit too (an HTTP server ignores the option).
      handshakeTimeout: headersTimeout,
    },
  };
}

export interface ConnectionsOptions {
  sendTimeoutSeconds: number;
  /** SEND_MIN_RATE: bytes per second; 0 for none. */
  sendMinRate: number;
  /** MAX_CONNECTIONS: a connection past it is reset as it arrives. */
  maxConnections: number;
  /** Told of each connection closed for MAX_CONNECTIONS. */
  onDropped?(): void;
}

/** The least time between two log lines about connections dropped for MAX_CONNECTIONS (a flood drops thousands). */
const DROP_LOG_INTERVAL_MS = 60_000;

/**
 * Each concern that must know when an answer ends listens for its response's 'close' (metrics, shutdown,
 * uploads, the send rate, Fastify's piping of a streamed body): a b64_json edit's answer passes Node's
 * default of 10 listeners, whose "possible memory leak" warning would be a false alarm in the log.
 */
const RESPONSE_LISTENERS = 32;

async function connectionsPlugin(app: FastifyInstance, { sendTimeoutSeconds, sendMinRate, maxConnections, onDropped }: ConnectionsOptions): Promise<void> {
  limitConnections(app, maxConnections, onDropped);
  app.addHook('onRequest', async (request, reply) => {
    reply.raw.setMaxListeners(RESPONSE_LISTENERS);
    closeWithConnection(request, reply);
  });
  app.addHook('onSend', async (request, reply) => {
    if (!request.raw.complete) readRest(request, reply);
    watchSending(request, reply, sendTimeoutSeconds, sendMinRate);
  });
}

/**
 * Past `max` open connections, a new one is reset as it is accepted, before it costs more than its
 * socket: without a bound, idle or slow clients could hold memory and file descriptors until accepting
 * stalls for everyone (/health included). Reset rather than closed: Node's own maxConnections closes
 * the socket quietly, which fetch-based clients (the OpenAI SDKs' Node transport among them) do not
 * notice, waiting for their timeout, while a reset fails their request at once and the SDKs retry it.
 * The first drop is logged, then at most one line a minute with how many were dropped since.
 */
function limitConnections(app: FastifyInstance, max: number, onDropped?: () => void): void {
  let open = 0;
  let [unlogged, loggedAt] = [0, -Infinity];
  // Before the HTTP server's own listener, so that a connection reset here is never parsed. An HTTPS
  // server hands over the TCP socket, before the handshake.
  app.server.prependListener('connection', (socket: Socket) => {
    open++;
    socket.once('close', () => open--);
    if (open <= max) return;
    socket.resetAndDestroy();
    onDropped?.();
    unlogged++;
    const now = performance.now();
    if (now - loggedAt < DROP_LOG_INTERVAL_MS) return;
    app.log.warn(`${plural(unlogged, 'connection')} reset as ${unlogged === 1 ? 'it' : 'they'} arrived: MAX_CONNECTIONS (${max}) were open; raise it, or look for clients holding connections idle`);
    [unlogged, loggedAt] = [0, now];
  });
}

/** Each connection's responses still waiting for the answers before them (see closeWithConnection). */
const pipelined = new WeakMap<Socket, Set<ServerResponse>>();

/**
 * Has a pipelined request's response (one that waits for the answers before it on its connection, with
 * no socket yet) close when its connection does. Node emits a response's 'close' from its socket, so
 * such a response never closed: what waits for it kept waiting for good, the request's UPLOAD_MEMORY
 * share (body-memory.ts: a key could fill the budget for every client with bodies pipelined behind a
 * slow request, then hang up), its cancellation (shutdown.ts: its generation still ran), shutdown's
 * count of requests in flight and the request metrics. It now closes as an answered one would. One
 * listener a connection, however many requests are pipelined on it.
 */
function closeWithConnection(request: FastifyRequest, reply: FastifyReply): void {
  const res = reply.raw;
  if (res.socket) return;
  const socket = request.raw.socket;
  let waiting = pipelined.get(socket);
  if (!waiting) {
    const responses = new Set<ServerResponse>();
    pipelined.set(socket, responses);
    socket.once('close', () => {
      for (const response of responses) {
        // Marked as Node marks a response whose socket closed, so that writes to it are dropped.
        response.destroy();
        response.emit('close');
      }
      responses.clear();
    });
    waiting = responses;
  }
  waiting.add(res);
  // Given its socket, the response closes with it as any does.
  res.once('socket', () => waiting.delete(res));
}

/** The body length a request declares (Content-Length; 0 when it declares none). */
export const declaredBodyBytes = (request: FastifyRequest): number => Number(request.headers['content-length'] ?? 0);

/**
 * Whether the request declares a JSON body over BODY_LIMIT, which Fastify refuses (413) as its reading
 * starts, before any of it is read: it is neither held against UPLOAD_MEMORY (content.ts) nor asked for
 * (expect.ts). A form's bounds are its parser's (uploads.ts).
 */
export const declaresJsonOverLimit = (request: FastifyRequest): boolean => !sendsForm(request) && declaredBodyBytes(request) > request.routeOptions.bodyLimit;

/** The most of a body read after its answer (see the module's comment): above the largest form an endpoint takes (109 MiB, edits.ts). */
export const LINGER_MAX_BYTES = 128 * 1024 ** 2;

/** Each connection's request whose body was last read after its answer (see isLingering). */
const lingering = new WeakMap<Socket, IncomingMessage>();

/**
 * Whether a connection is reading the rest of a body after its request's answer: should the body not
 * arrive within the request timeout, the connection just closes (errors.ts), with no second answer
 * after the first. Once the body is in, a request after it on the connection is answered as any.
 */
export const isLingering = (socket: Socket): boolean => lingering.get(socket)?.complete === false;

/**
 * Fastify marks the connection to close after any error met while a body is read (the client may send
 * more), which is not a close on purpose: a body refused part-way (over BODY_LIMIT as declared or as
 * read, UPLOAD_MEMORY full) then had its upload reset under a client still sending it, which saw a
 * connection error instead of the 413 or 429 (and the SDKs sent it again), and nginx in front answered
 * its own 502 and took the replica out for a while. Its rest is read and dropped as any (readRest); an
 * answer that closes on purpose says so in its own headers, which are set after this. (With the header
 * removed, Node sends none: an HTTP/1.1 connection stays open by default, unless its client asked to close.)
 */
export function keepOpenForRest(request: FastifyRequest, reply: FastifyReply): void {
  if (!request.raw.complete && reply.getHeader('connection') === 'close') reply.removeHeader('connection');
}

/** Reads and drops the rest of a request's body after its answer, or has the connection closed after it (see the module's comment). */
function readRest(request: FastifyRequest, reply: FastifyReply): void {
  const raw = request.raw;
  const socket = raw.socket;
  const declared = declaredBodyBytes(request);
  if (reply.getHeader('connection') === 'close' || raw.destroyed || declared > LINGER_MAX_BYTES) {
    reply.header('connection', 'close');
    return;
  }
  let read = 0;
  const drop = (chunk: Buffer) => {
    read += chunk.byteLength;
    if (read > LINGER_MAX_BYTES) socket.destroy();
  };
  lingering.set(socket, raw);
  // The answer is out: nothing else is to take the rest (a form parser still piped would buffer it).
  raw.unpipe();
  raw.on('data', drop);
  raw.once('end', () => raw.off('data', drop));
  raw.resume();
}

/** How often a waiting answer's progress is looked at: a client is cut at most this long after its window ran out. */
const SEND_CHECK_MS = 1000;

/**
 * Cuts the connection of a client that, over the last `windowSeconds`, at whose start and end part of
 * its answer waited for it, took none of it, or less than `minRate` bytes a second. What the client took is
 * what the socket finished writing: the bytes handed to it (bytesWritten) less those it still holds
 * (writableLength). Our own clock rather than the socket's inactivity timer: that one counts a write the
 * kernel finishes as the client's doing and lets such a client stay for about two windows (Node defers
 * it once whenever the write queue moved since the write).
 */
function watchSending(request: FastifyRequest, reply: FastifyReply, windowSeconds: number, minRate: number): void {
  const res = reply.raw;
  const socket = res.socket;
  // An answer to a client that already left still goes through onSend.
  if (res.destroyed || res.writableFinished) return;
  // A pipelined request's answer gets its socket once the answers before it are out.
  if (!socket) return void res.once('socket', () => watchSending(request, reply, windowSeconds, minRate));
  const windowMs = windowSeconds * 1000;
  const taken = () => socket.bytesWritten - socket.writableLength;
  // What the client had taken at each look over the last window, and whether part of the answer waited.
  const looks: { at: number; taken: number; waiting: boolean }[] = [];
  const check = setInterval(() => {
    const now = performance.now();
    // writableLength: what the answer has queued that the socket has not taken yet.
    looks.push({ at: now, taken: taken(), waiting: res.writableLength > 0 });
    // The look a window ago stays as the window's start; older ones go.
    while (looks.length > 1 && looks[1].at <= now - windowMs) looks.shift();
    const [start, end] = [looks[0], looks.at(-1)!];
    // Judged over a whole window that began and ended with part of the answer waiting: a stream between
    // events, or an answer the socket took whole, waits for nobody.
    if (start.at > now - windowMs || !start.waiting || !end.waiting) return;
    const took = end.taken - start.taken;
    if (took >= Math.max(1, minRate * windowSeconds)) return;
    // Said by the rule that applies: a client that reads slowly can look as if it took nothing for a
    // while, the kernel taking nothing more from the socket until its buffer has room for a good part.
    const message =
      minRate > 0
        ? 'the client took less than SEND_MIN_RATE of its answer over SEND_TIMEOUT_SECONDS: connection closed'
        : 'the client took none of its answer for SEND_TIMEOUT_SECONDS: connection closed';
    request.log.warn({ sendTimeoutSeconds: windowSeconds, sendMinRate: minRate, bytesTaken: took }, message);
    cut(socket);
  }, Math.min(SEND_CHECK_MS, windowMs / 4));
  check.unref();
  finished(res, () => clearInterval(check));
}

/**
 * Ends a connection with a reset, not a close: a FIN would wait behind the unsent answer, and the
 * kernel would keep that answer (megabytes) for an orphaned socket that nobody reads. A TLS socket's
 * handle is its TLS layer, which Node cannot reset (it throws): that one is closed.
 */
function cut(socket: Socket): void {
  try {
    socket.resetAndDestroy();
  } catch {
    socket.destroy();
  }
}

export const connections = fp(connectionsPlugin, { name: 'connections' });
