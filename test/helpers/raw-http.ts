import { request as httpRequest } from 'node:http';
import net from 'node:net';

/** Raw HTTP over a TCP socket, for what fetch and the SDK never send (or never let a test see). */

export interface RawExchange {
  /** Everything the server sent. */
  text: string;
  /** When the server closed the connection, in ms after connecting; undefined while open. */
  closedAfterMs?: number;
  socket: net.Socket;
  /** Resolves when the server has closed the connection. */
  closed: Promise<void>;
}

/** Connects, writes `request`, and records what comes back and when the server hangs up. */
export function rawRequest(port: number, request: string | Buffer = ''): RawExchange {
  const started = Date.now();
  const socket = net.connect(port, '127.0.0.1');
  const exchange: RawExchange = { text: '', socket, closed: Promise.resolve() };
  exchange.closed = new Promise((resolve) => {
    socket.on('data', (chunk) => (exchange.text += chunk.toString()));
    socket.on('error', () => {});
    socket.on('close', () => {
      exchange.closedAfterMs = Date.now() - started;
      resolve();
    });
  });
  if (request.length > 0) socket.write(request);
  return exchange;
}

/** The status line, headers (lower-case names) and body of the one response in `text` (after a 100 Continue, if any). */
export function parseResponse(text: string): { status: string; headers: Record<string, string>; body: string } {
  const [head, body = ''] = text.replace(/^HTTP\/1\.1 100 Continue\r\n\r\n/, '').split('\r\n\r\n');
  const [status, ...lines] = head.split('\r\n');
  const headers = Object.fromEntries(lines.map((line) => [line.slice(0, line.indexOf(':')).toLowerCase(), line.slice(line.indexOf(':') + 1).trim()]));
  return { status, headers, body };
}

/**
 * POSTs `body` as JSON to `path` over HTTP/1.0 with no Host header, as old clients may (HTTP/1.1 requires
 * one): the answer, once the server (or the proxy at `port`) has closed the connection.
 */
export async function postWithoutHost(port: number, path: string, authorization: string, body: string): Promise<ReturnType<typeof parseResponse>> {
  const exchange = rawRequest(port, `POST ${path} HTTP/1.0\r\nAuthorization: ${authorization}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
  await exchange.closed;
  return parseResponse(exchange.text);
}

/** Connects and writes `request`, reading none of the answer until the caller resumes the socket: a client that leaves its answer unread. */
export function unreadRequest(port: number, request: string): net.Socket {
  const socket = net.connect(port, '127.0.0.1');
  socket.pause();
  socket.on('error', () => {});
  socket.write(request);
  return socket;
}

/**
 * POSTs to `url` a multipart form announced as `bytes` long, of which nothing is sent: the answer a server
 * (or a proxy) gives from the headers alone, its status and body. The request is dropped once it came.
 */
export function announcedForm(url: string, authorization: string, bytes: number): Promise<{ status?: number; body: string }> {
  return new Promise((resolve, reject) => {
    const sent = httpRequest(url, {
      method: 'POST',
      headers: { authorization, 'content-type': 'multipart/form-data; boundary=x', 'content-length': String(bytes) },
    });
    sent.on('response', (res) => {
      let body = '';
      res.on('data', (chunk: Buffer) => (body += chunk.toString()));
      res.on('end', () => {
        resolve({ status: res.statusCode, body });
        sent.destroy();
      });
    });
    sent.on('error', reject);
    sent.flushHeaders();
  });
}
