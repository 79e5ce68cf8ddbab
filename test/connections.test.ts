import { execFile, spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import { get } from 'node:https';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { promisify } from 'node:util';
import { gzipSync, brotliCompressSync, deflateSync } from 'node:zlib';
import { randomBytes } from 'node:crypto';
import net from 'node:net';
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, TEST_KEY, type TestServer, type TestServerOptions } from './helpers/api-server.js';
import { metric, scrape } from './helpers/ops-server.js';
import { FakeEngine } from './helpers/engines.js';
import { capturedLogs } from './helpers/logs.js';
import { haveOpenssl, selfSignedCertificate } from './helpers/certificate.js';
import { MAX_PARAM_LENGTH } from '../src/http/app.js';
import { LINGER_MAX_BYTES } from '../src/http/connections.js';
import { LARGEST_FORM_BYTES } from '../src/http/edits.js';
import { parseResponse, rawRequest, unreadRequest, type RawExchange } from './helpers/raw-http.js';

/**
 * Issue #13's connection hardening, over raw sockets: slow and stalled requests time out, refusals are
 * answered before the body (whose rest is then dropped as it comes, so that a client still uploading
 * reads the answer), and every answer, even those Node's parser gives before any route, carries
 * x-request-id and OpenAI's error body.
 */

/** The file's certificate (needs openssl): made once, as an RSA key takes a while to make, and shared by its HTTPS servers. */
let certificate: Promise<{ cert: Buffer; key: Buffer }> | undefined;
async function makeCertificate(): Promise<{ cert: Buffer; key: Buffer }> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-tls-'));
  try {
    const { cert, key } = selfSignedCertificate(dir);
    return { cert: readFileSync(cert), key: readFileSync(key) };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** A test server serving HTTPS with the file's certificate. */
async function startSecureServer(options: TestServerOptions = {}): Promise<TestServer> {
  return startTestServer({ ...options, tls: await (certificate ??= makeCertificate()) });
}

/** Resolves after `ms`: bounds a wait that, failing, would last as long as Node's own timeouts (minutes). */
const atMost = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** Short limits, so a stalled request is given up within seconds. */
const SHORT_LIMITS = { headersTimeoutSeconds: 1, requestTimeoutSeconds: 2, sendTimeoutSeconds: 1 };

let server: TestServer;
let port: number;
/**
 * SHORT_LIMITS but a request timeout of 30 s, far above what a step of a test takes on a loaded machine:
 * what must happen before it (an answer, the rest of a body sent after it) has room to, and what waits
 * for it (a refusal that waited for the body) takes long enough to show.
 */
let patient: TestServer;
let patientPort: number;
beforeAll(async () => {
  [server, patient] = await Promise.all([startTestServer({ config: SHORT_LIMITS }), startTestServer({ config: { ...SHORT_LIMITS, requestTimeoutSeconds: 30 } })]);
  port = Number(new URL(server.origin).port);
  patientPort = Number(new URL(patient.origin).port);
});
afterAll(() => Promise.all([server.close(), patient.close()]));

const BODY = JSON.stringify({ model: 'stub', prompt: 'a red circle' });

function head(lines: string[]): string {
  return `${lines.join('\r\n')}\r\n\r\n`;
}

function expectOpenAiError(text: string, status: number, code: string | null) {
  const { status: line, headers, body } = parseResponse(text);
  expect(line, text).toMatch(new RegExp(`^HTTP/1\\.1 ${status} `));
  expect(headers['x-request-id'], text).toMatch(/^req_[0-9a-f]{32}$/);
  expect(headers['content-type'], text).toMatch(/^application\/json/);
  const { error } = JSON.parse(body) as ErrorBody;
  expect(Object.keys(error).sort()).toEqual(['code', 'message', 'param', 'type']);
  expect(error.code, text).toBe(code);
  return { headers, error };
}

describe('slow and stalled requests', () => {
  it('closes 50 connections trickling a body within the request timeout, each with a 408', async () => {
    const started = Date.now();
    const exchanges = Array.from({ length: 50 }, () =>
      rawRequest(port, head(['POST /v1/images/generations HTTP/1.1', 'Host: 127.0.0.1', `Authorization: Bearer ${TEST_KEY}`, 'Content-Type: application/json', 'Content-Length: 10000'])),
    );
    // One byte every 200 ms: never idle, never done.
    const trickle = setInterval(() => exchanges.forEach((e) => e.socket.writable && e.socket.write('{')), 200);
    try {
      await Promise.all(exchanges.map((e) => e.closed));
    } finally {
      clearInterval(trickle);
    }
    // REQUEST_TIMEOUT_SECONDS=2, checked every second: all gone in about 3 s, long before the trickle
    // could finish (2000 s) or Node's own request timeout (300 s) would end it; 20 s tells those apart
    // and leaves a loaded machine room (6 s was near it).
    expect(Date.now() - started).toBeLessThan(20_000);
    for (const exchange of exchanges) expectOpenAiError(exchange.text, 408, 'request_timeout');
    // It names the limits and the setting to raise (a slow link's large upload meets them first).
    expect(expectOpenAiError(exchanges[0].text, 408, 'request_timeout').error.message).toBe(
      "The request took too long to arrive: its headers must be sent within 1 s (the server's HEADERS_TIMEOUT_SECONDS) and all of it, body included, within 2 s (REQUEST_TIMEOUT_SECONDS). " +
        "Send a smaller image over a slow link, or have the server's REQUEST_TIMEOUT_SECONDS raised.",
    );
  });

  it('closes a connection that sends nothing, or only part of its headers', async () => {
    const silent = rawRequest(port);
    const partial = rawRequest(port, 'GET /health HTTP/1.1\r\nHost: a\r\n');
    await Promise.all([silent.closed, partial.closed]);
    // HEADERS_TIMEOUT_SECONDS=1, checked every second: about 2 s; Node's own headers timeout is 60 s and
    // ours by default 30 s, which 15 s still tells apart on a loaded machine (4 s was near it).
    expect(silent.closedAfterMs).toBeLessThan(15_000);
    expectOpenAiError(partial.text, 408, 'request_timeout');
  });

  it.skipIf(!haveOpenssl)(
    `closes an HTTPS connection that sends nothing, or only the start of its TLS handshake, as one over HTTP${haveOpenssl ? '' : ' (skipped: needs openssl to make a certificate)'}`,
    async () => {
      const secure = await startSecureServer({ config: SHORT_LIMITS });
      const securePort = Number(new URL(secure.origin).port);
      // A TLS record header announcing a ClientHello whose bytes never come.
      const silent = rawRequest(securePort);
      const partial = rawRequest(securePort, Buffer.from([0x16, 0x03, 0x01, 0x02, 0x00]));
      // Once the handshake is done, the connection outlives the handshake's limit: an idle keep-alive
      // connection is still served after it.
      const done = tls.connect({ port: securePort, host: '127.0.0.1', rejectUnauthorized: false });
      done.on('error', () => {});
      try {
        await once(done, 'secureConnect');
        // HEADERS_TIMEOUT_SECONDS=1, checked every second: about 2 s; Node's own TLS handshake timeout,
        // which held them before, is 120 s.
        await Promise.race([Promise.all([silent.closed, partial.closed]), atMost(15_000)]);
        expect(silent.closedAfterMs, 'a silent connection is closed').toBeLessThan(15_000);
        expect(partial.closedAfterMs, 'a connection with half a ClientHello is closed').toBeLessThan(15_000);
        done.write('GET /health HTTP/1.1\r\nHost: a\r\n\r\n');
        const [answer] = (await once(done, 'data')) as [Buffer];
        expect(answer.toString()).toMatch(/^HTTP\/1\.1 200 /);
      } finally {
        for (const socket of [done, silent.socket, partial.socket]) socket.destroy();
        await secure.close();
      }
    },
  );

  it.skipIf(!haveOpenssl)(`answers a plain HTTP request to the HTTPS port, in plain HTTP, that it serves HTTPS${haveOpenssl ? '' : ' (skipped: needs openssl to make a certificate)'}`, async () => {
    const secure = await startSecureServer();
    // An app or a balancer given http:// for a server with TLS_CERT: it saw only a closed connection
    // (the SDK's "Connection error.", curl's "Empty reply from server", a balancer's 502).
    const client = new OpenAI({ baseURL: secure.baseURL.replace(/^https:/, 'http:'), apiKey: TEST_KEY, maxRetries: 0 });
    try {
      const err = await client.models.list().catch((caught: unknown) => caught);
      expect(err).toBeInstanceOf(OpenAI.BadRequestError);
      expect(err).toMatchObject({ status: 400, code: 'https_required', message: expect.stringMatching(/plain HTTP to a port that serves HTTPS: use an https:\/\/ URL/) });
      expect((err as InstanceType<typeof OpenAI.BadRequestError>).requestID).toMatch(/^req_[0-9a-f]{32}$/);
    } finally {
      await secure.close();
    }
  });

  it.skipIf(!haveOpenssl)(`does not let an HTTPS connection that never begins its handshake hold up the server's close (SIGTERM's graceful shutdown)${haveOpenssl ? '' : ' (skipped: needs openssl to make a certificate)'}`, async () => {
    // The default HEADERS_TIMEOUT_SECONDS (30 s), which bounds the handshake too.
    const secure = await startSecureServer();
    const silent = rawRequest(Number(new URL(secure.origin).port));
    try {
      await once(silent.socket, 'connect');
      const started = performance.now();
      await Promise.race([secure.close(), atMost(20_000)]);
      // With nothing in flight the close takes milliseconds; it waited for the handshake's timeout (30 s
      // here, 120 s by Node's default), and a service manager's stop timeout could kill it first.
      expect(performance.now() - started).toBeLessThan(10_000);
      await Promise.race([silent.closed, atMost(5_000)]);
      expect(silent.closedAfterMs).toBeDefined();
    } finally {
      silent.socket.destroy();
    }
  });

  it('does not cut off a request whose body arrived, however long the answer takes', async () => {
    // A fake engine: the answer is held past the request timeout, longer than a real generation takes.
    const slow = await startTestServer({ engine: new FakeEngine(), config: SHORT_LIMITS });
    slow.engine.hold();
    try {
      const exchange = rawRequest(Number(new URL(slow.origin).port), head(['POST /v1/images/generations HTTP/1.1', 'Host: a', `Authorization: Bearer ${TEST_KEY}`, 'Content-Type: application/json', `Content-Length: ${BODY.length}`]) + BODY);
      await new Promise((resolve) => setTimeout(resolve, 3500));
      expect(exchange.closedAfterMs).toBeUndefined();
      slow.engine.release();
      await expect.poll(() => parseResponse(exchange.text).status).toMatch(/^HTTP\/1\.1 200/);
      exchange.socket.destroy();
    } finally {
      slow.engine.release();
      await slow.close();
    }
  });

  it('answers a request whose body stalls with a 408 under its own id, and logs and counts it as a 408, not as a client that left', async () => {
    // A slow upload (an edit's picture from a phone): the request was routed, its key checked, then its
    // body stopped. Before, the 408 came under a fresh id, the request's own line said the client closed
    // the connection, and /metrics counted it as a 499.
    const logs = capturedLogs<{ msg: string; reqId?: string; apiKey?: string; status?: number }>();
    const stalled = await startTestServer({ config: SHORT_LIMITS, logger: logs.logger });
    try {
      const exchange = rawRequest(
        Number(new URL(stalled.origin).port),
        head(['POST /v1/images/generations HTTP/1.1', 'Host: a', `Authorization: Bearer ${TEST_KEY}`, 'x-request-id: slow-upload-1', 'Content-Type: application/json', 'Content-Length: 1000']) + '{"prompt":',
      );
      await exchange.closed;
      const { status, headers } = parseResponse(exchange.text);
      expect(status).toMatch(/^HTTP\/1\.1 408 /);
      expect(headers['x-request-id']).toBe('slow-upload-1');
      const own = logs.lines.filter((line) => line.reqId === 'slow-upload-1');
      expect(own.map((line) => line.msg)).not.toContain('request aborted: the client closed the connection before the answer was sent');
      expect(own.find((line) => line.status === 408)).toMatchObject({ apiKey: expect.any(String) });
      const metrics = await scrape(stalled.origin, TEST_KEY);
      expect(metrics).toContain('imagegen_http_requests_total{method="POST",route="/v1/images/generations",status="408"} 1');
      expect(metrics).not.toContain('status="499"');
    } finally {
      await stalled.close();
    }
  });
});

/** Whether `ss` (iproute2, Linux) can show the server's sockets' timers. */
const haveSs = process.platform === 'linux' && spawnSync('ss', ['-V']).status === 0;

describe('a plain request while its images are made', () => {
  it.skipIf(!haveSs)(`keeps its connection alive with TCP probes, which balancers forwarding TCP count as traffic${haveSs ? '' : ' (skipped: needs Linux and ss to read the socket timer)'}`, async () => {
    const held = await startTestServer({ engine: new FakeEngine() });
    held.engine.hold();
    const heldPort = Number(new URL(held.origin).port);
    const exchange = rawRequest(heldPort, head(['POST /v1/images/generations HTTP/1.1', 'Host: 127.0.0.1', `Authorization: Bearer ${TEST_KEY}`, 'Content-Type: application/json', `Content-Length: ${BODY.length}`]) + BODY);
    try {
      // Nothing goes either way while the engine holds the request (minutes of a real model on a CPU):
      // the server's end of the connection is the one that sends the probes.
      await expect.poll(() => held.engine.signals.length).toBe(1);
      const serverEnd = spawnSync('ss', ['-tnoH', 'state', 'established', `( sport = :${heldPort} and dport = :${exchange.socket.localPort} )`], { encoding: 'utf8' }).stdout;
      expect(serverEnd).toMatch(/timer:\(keepalive,/);
    } finally {
      // Answered before the connection goes: a request cancelled as the server closes leaves its store busy.
      held.engine.release();
      await expect.poll(() => parseResponse(exchange.text).status).toMatch(/^HTTP\/1\.1 200/);
      exchange.socket.destroy();
      await held.close();
    }
  });
});

describe('refusals before the body', () => {
  it('answers a missing or wrong key with 401 before the body, then drops the body as it comes', async () => {
    for (const authorization of [[], ['Authorization: Bearer sk-wrong-0000000000']]) {
      // The patient server: its request timeout leaves time to send the body after the answer, however slow the machine.
      const exchange = rawRequest(patientPort, head(['POST /v1/images/generations HTTP/1.1', 'Host: a', ...authorization, 'Content-Type: application/json', 'Content-Length: 100000']));
      await expect.poll(() => exchange.text.includes('\r\n\r\n{')).toBe(true);
      // Before the request timeout: nobody waited for the 100000 bytes, none of which was sent (a 401
      // that waited for them would have been the timeout's 408, on a connection it closed).
      expect(exchange.closedAfterMs).toBeUndefined();
      const { headers } = expectOpenAiError(exchange.text, 401, authorization.length ? 'invalid_api_key' : null);
      expect(headers.connection).toBe('keep-alive');
      // The body, sent after its answer, is read and dropped: the connection takes the next request.
      exchange.socket.write('x'.repeat(100_000));
      exchange.socket.write(head(['GET /health HTTP/1.1', 'Host: a']));
      await expect.poll(() => exchange.text.match(/HTTP\/1\.1 200 OK/g)?.length ?? 0).toBe(1);
      exchange.socket.destroy();
    }
    // A body that never comes ends its connection at the request timeout, with no second answer.
    const stalled = rawRequest(port, head(['POST /v1/images/generations HTTP/1.1', 'Host: a', 'Content-Type: application/json', 'Content-Length: 100000']));
    await stalled.closed;
    expect(stalled.text.match(/HTTP\/1\.1 \d{3} /g)).toHaveLength(1);
    expectOpenAiError(stalled.text, 401, null);
  });

  it('answers a malformed request that follows a dropped body, as on any connection', async () => {
    // The patient server: the rest of the body goes once the test has seen the answer, which a loaded
    // machine can take past a 2 s request timeout (the connection then closes with the 401 alone).
    const exchange = rawRequest(patientPort, head(['POST /v1/images/generations HTTP/1.1', 'Host: a', 'Content-Type: application/json', 'Content-Length: 10']));
    await expect.poll(() => exchange.text.includes('\r\n\r\n{')).toBe(true);
    exchange.socket.write('x'.repeat(10) + 'GARBAGE LINE\x01\r\n\r\n');
    await exchange.closed;
    expect(exchange.text.match(/HTTP\/1\.1 \d+/g)).toEqual(['HTTP/1.1 401', 'HTTP/1.1 400']);
  });

  it('answers a JSON body over BODY_LIMIT with 413 as it comes, then drops the rest: the upload is not reset under its client, nor under a proxy', async () => {
    const MiB = 1024 ** 2;
    for (const length of ['Content-Length: ' + 3 * MiB, 'Transfer-Encoding: chunked']) {
      const exchange = rawRequest(patientPort, head(['POST /v1/images/generations HTTP/1.1', 'Host: a', `Authorization: Bearer ${TEST_KEY}`, 'Content-Type: application/json', length]));
      const chunked = length.startsWith('Transfer');
      // Past the limit (1 MiB): the 413 comes before the body ends. Before, the connection closed with the
      // rest unread (Fastify's own close after a body error), which resets an upload still being sent.
      const part = Buffer.alloc(1.5 * MiB, 0x61);
      exchange.socket.write(chunked ? Buffer.concat([Buffer.from(`${part.length.toString(16)}\r\n`), part, Buffer.from('\r\n')]) : part);
      await expect.poll(() => exchange.text.includes('\r\n\r\n{')).toBe(true);
      const { headers } = expectOpenAiError(exchange.text, 413, 'request_too_large');
      expect(headers.connection).not.toBe('close');
      // The rest, sent after the answer, is read and dropped: the connection takes the next request.
      exchange.socket.write(chunked ? Buffer.concat([Buffer.from(`${part.length.toString(16)}\r\n`), part, Buffer.from('\r\n0\r\n\r\n')]) : part);
      exchange.socket.write(head(['GET /health HTTP/1.1', 'Host: a']));
      await expect.poll(() => exchange.text.match(/HTTP\/1\.1 200 OK/g)?.length ?? 0).toBe(1);
      exchange.socket.destroy();
    }
  });

  it('answers a JSON body declared over BODY_LIMIT with 413 and no 100 Continue: its client need not send it', async () => {
    const exchange = rawRequest(port, head(['POST /v1/images/generations HTTP/1.1', 'Host: a', `Authorization: Bearer ${TEST_KEY}`, 'Expect: 100-continue', 'Content-Type: application/json', `Content-Length: ${2 * 1024 ** 2}`]));
    await expect.poll(() => exchange.text.includes('\r\n\r\n{')).toBe(true);
    expect(exchange.text).not.toContain('100 Continue');
    expectOpenAiError(exchange.text, 413, 'request_too_large');
    exchange.socket.destroy();
  });

  it('drops the rest of a body as large as the largest form after its answer, and closes at once after the answer when the declared body is over what it would drop (128 MiB)', async () => {
    // An edit's largest form (109 MiB) refused for its key: its upload is read and dropped, not reset under its client.
    const form = rawRequest(patientPort, head(['POST /v1/images/edits HTTP/1.1', 'Host: a', 'Content-Type: multipart/form-data; boundary=b', `Content-Length: ${LARGEST_FORM_BYTES}`]));
    await expect.poll(() => form.text.includes('\r\n\r\n{')).toBe(true);
    expect(expectOpenAiError(form.text, 401, null).headers.connection).toBe('keep-alive');
    form.socket.destroy();
    const exchange = rawRequest(patientPort, head(['POST /v1/images/generations HTTP/1.1', 'Host: a', 'Content-Type: application/json', `Content-Length: ${LINGER_MAX_BYTES + 1}`]));
    await exchange.closed;
    // Not at the patient server's 30 s request timeout, as a connection left to read the body closes;
    // 10 s leaves a loaded machine room (1.5 s against a 2 s timeout was near it).
    expect(exchange.closedAfterMs).toBeLessThan(10_000);
    expect(expectOpenAiError(exchange.text, 401, null).headers.connection).toBe('close');
  });

  it('sends 100 Continue only to a request whose key is good', async () => {
    const refused = rawRequest(port, head(['POST /v1/images/generations HTTP/1.1', 'Host: a', 'Expect: 100-continue', 'Content-Type: application/json', `Content-Length: ${BODY.length}`]));
    await refused.closed;
    expect(refused.text).not.toContain('100 Continue');
    expectOpenAiError(refused.text, 401, null);

    // The patient server: the body goes once the test has seen the 100 Continue, which a loaded machine
    // can take past a 2 s request timeout (a 408 then).
    const accepted = rawRequest(patientPort, head(['POST /v1/images/generations HTTP/1.1', 'Host: a', `Authorization: Bearer ${TEST_KEY}`, 'Expect: 100-continue', 'Content-Type: application/json', `Content-Length: ${BODY.length}`]));
    await expect.poll(() => accepted.text).toMatch(/^HTTP\/1\.1 100 Continue\r\n/);
    accepted.socket.write(BODY);
    // The file's first generation: it waits for the engine's worker to start.
    await expect.poll(() => parseResponse(accepted.text).status, { timeout: 30_000 }).toMatch(/^HTTP\/1\.1 200/);
    accepted.socket.destroy();
  });
});

describe('answers before routing', () => {
  const cases: [string, string, number, string][] = [
    ['no Host', 'GET /health HTTP/1.1\r\n\r\n', 400, 'invalid_host_header'],
    ['a Host with userinfo', 'GET /health HTTP/1.1\r\nHost: 127.0.0.1:1@evil.example\r\n\r\n', 400, 'invalid_host_header'],
    ['two Host headers', 'GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n', 400, 'invalid_host_header'],
    ['a bad request line', 'HELLO\r\n\r\n', 400, 'malformed_request'],
    ['headers over 16 KiB', `GET /health HTTP/1.1\r\nHost: a\r\nX-Padding: ${'p'.repeat(20_000)}\r\n\r\n`, 431, 'request_header_fields_too_large'],
    ['an unknown expectation', 'GET /health HTTP/1.1\r\nHost: a\r\nExpect: tea\r\n\r\n', 417, 'expectation_failed'],
    ['bad percent-encoding', 'GET /v1/models/%E0%A4%A HTTP/1.1\r\nHost: a\r\n\r\n', 400, 'invalid_url'],
    // A client told to use the server as its proxy: Node closed the socket unanswered ("socket hang up").
    ['CONNECT', 'CONNECT api.openai.com:443 HTTP/1.1\r\nHost: api.openai.com:443\r\n\r\n', 405, 'method_not_allowed'],
    ['two Authorization headers', `GET /v1/models HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ${TEST_KEY}\r\nauthorization: Bearer other\r\n\r\n`, 400, 'invalid_authorization_header'],
  ];
  it.each(cases)('%s: OpenAI error with x-request-id', async (_name, request, status, code) => {
    const exchange = rawRequest(port, request);
    await expect.poll(() => exchange.text.includes('\r\n\r\n{')).toBe(true);
    const { headers } = expectOpenAiError(exchange.text, status, code);
    if (code === 'invalid_host_header') {
      // What a proxy in front made of this stream is in doubt: nothing more is read from it.
      expect(headers.connection).toBe('close');
      await exchange.closed;
    }
    exchange.socket.destroy();
  });
});

/** Image downloads the server closed unfinished (counted as 499, the client's doing). */
async function abandonedDownloads(): Promise<number> {
  const text = await (await fetch(`${server.origin}/metrics`, { headers: { authorization: `Bearer ${TEST_KEY}` } })).text();
  return Number(/^imagegen_http_requests_total\{method="GET",route="\/v1\/images\/files\/:name",status="499"\} (\d+)$/m.exec(text)?.[1] ?? 0);
}

const havePython = spawnSync('python3', ['-c', 'import socket']).status === 0;

/**
 * The sockets of `port`'s side in FIN-WAIT-1 (closed by the server, waiting for the client to take what
 * was sent before the FIN), read from the kernel's table (Linux's /proc/net/tcp and tcp6).
 */
function finWaitSockets(port: number): number {
  const FIN_WAIT1 = '04';
  const local = `:${port.toString(16).toUpperCase().padStart(4, '0')}`;
  return ['/proc/net/tcp', '/proc/net/tcp6']
    .flatMap((table) => readFileSync(table, 'utf8').trim().split('\n').slice(1))
    .map((line) => line.trim().split(/\s+/))
    .filter(([, address, , state]) => address.endsWith(local) && state === FIN_WAIT1).length;
}

/** A client on `port` that asks for `images` (pipelined, in one write) and reads nothing of the answers. */
function nonReadingClient(port: number, images: { id: string }[]): net.Socket {
  return unreadRequest(port, images.map((image) => `GET /v1/images/files/${image.id}.png HTTP/1.1\r\nHost: a\r\n\r\n`).join(''));
}

describe('a client that does not read its answer', () => {
  it('has its connection reset once it took none of it for SEND_TIMEOUT_SECONDS, within about one such window', async () => {
    // A 5 s window: Node's socket timer (the way before) cut such a client after about two (10 s). The
    // bound leaves 3 s for the rest (the answer's start, the poll): with a 3 s window and a 5 s bound,
    // a run with the machine's load at 15 took 3.85 s of it.
    const logs = capturedLogs<{ msg: string }>();
    const windowed = await startTestServer({ config: { sendTimeoutSeconds: 5, sendMinRate: 0 }, logger: logs.logger });
    // An image far larger than the sockets' buffers, asked for by a client that reads nothing.
    const image = await windowed.store.put(randomBytes(32 * 1024 ** 2), 'image/png');
    const windowedPort = Number(new URL(windowed.origin).port);
    const asked = performance.now();
    const socket = nonReadingClient(windowedPort, [image]);
    try {
      const cut = () => logs.lines.some((line) => line.msg === 'the client took none of its answer for SEND_TIMEOUT_SECONDS: connection closed');
      await expect.poll(cut, { timeout: 15_000, interval: 100 }).toBe(true);
      expect(performance.now() - asked).toBeLessThan(8_000);
      // Reset, so the kernel drops the unsent answer: a FIN would queue behind it, and the server's side
      // would stay in FIN-WAIT-1 holding megabytes for as long as the client does not read.
      expect(finWaitSockets(windowedPort)).toBe(0);
    } finally {
      socket.destroy();
      await windowed.close();
    }
  });

  it.skipIf(!haveOpenssl)(`over HTTPS is cut too, and the server goes on${haveOpenssl ? '' : ' (skipped: needs openssl to make a certificate)'}`, async () => {
    // Node cannot reset a TLS socket (its handle is the TLS layer): it is closed instead, not a crash.
    const logs = capturedLogs<{ msg: string }>();
    const secure = await startSecureServer({ config: { sendTimeoutSeconds: 1, sendMinRate: 0 }, logger: logs.logger });
    const image = await secure.store.put(randomBytes(32 * 1024 ** 2), 'image/png');
    const securePort = Number(new URL(secure.origin).port);
    const socket = tls.connect({ port: securePort, host: '127.0.0.1', rejectUnauthorized: false }, () => {
      socket.write(`GET /v1/images/files/${image.id}.png HTTP/1.1\r\nHost: a\r\n\r\n`);
      socket.pause();
    });
    socket.on('error', () => {});
    try {
      const cut = () => logs.lines.some((line) => line.msg === 'the client took none of its answer for SEND_TIMEOUT_SECONDS: connection closed');
      await expect.poll(cut, { timeout: 10_000, interval: 100 }).toBe(true);
      const health = await new Promise<number>((resolve, reject) => get(`${secure.origin}/health`, { rejectUnauthorized: false }, (res) => resolve(res.statusCode!)).on('error', reject));
      expect(health).toBe(200);
    } finally {
      socket.destroy();
      await secure.close();
    }
  });

  it('is watched on an answer to a pipelined request too, which gets its socket only once the answers before it are out', async () => {
    const [small, big] = [await server.store.put(randomBytes(1024), 'image/png'), await server.store.put(randomBytes(32 * 1024 ** 2), 'image/png')];
    const before = await abandonedDownloads();
    const socket = nonReadingClient(port, [small, big]);
    try {
      await expect.poll(abandonedDownloads, { timeout: 10_000 }).toBe(before + 1);
    } finally {
      socket.destroy();
    }
  });

  it("is counted as 499, the client's doing", async () => {
    const image = await server.store.put(randomBytes(32 * 1024 ** 2), 'image/png');
    const before = await abandonedDownloads();
    const socket = nonReadingClient(port, [image]);
    try {
      await expect.poll(abandonedDownloads, { timeout: 10_000 }).toBe(before + 1);
    } finally {
      socket.destroy();
    }
  });
});

describe('a client that hangs up once it has the whole answer', () => {
  /** A download as curl makes it: read the answer to its last byte, then close the connection. */
  function download(path: string): Promise<number> {
    return new Promise((resolve, reject) => {
      const socket = net.connect(port, '127.0.0.1');
      let received = Buffer.alloc(0);
      socket.on('error', reject);
      socket.on('data', (chunk: Buffer) => {
        received = Buffer.concat([received, chunk]);
        const end = received.indexOf('\r\n\r\n');
        if (end < 0) return;
        const length = Number(/content-length: (\d+)/i.exec(received.subarray(0, end).toString())![1]);
        if (received.length < end + 4 + length) return;
        socket.destroy();
        resolve(received.length - end - 4);
      });
      socket.write(`GET ${path} HTTP/1.1\r\nHost: a\r\n\r\n`);
    });
  }

  it('is counted under its status, not as 499, however soon it hangs up', async () => {
    // One read of the store's file stream (64 KiB): the close races the stream's end whatever the size
    // (with the end left to a read past it, 12 and 29 of 100 such downloads counted 499; 100 of 1 MiB took 11 s).
    const image = await server.store.put(randomBytes(64 * 1024), 'image/png');
    const before = await abandonedDownloads();
    for (let i = 0; i < 100; i++) expect(await download(`/v1/images/files/${image.id}.png`)).toBe(64 * 1024);
    expect(await abandonedDownloads()).toBe(before);
  });
});

/**
 * A client that reads a little at a time through a small receive buffer, as the trickler of the memory
 * review did (Python: Node's sockets cannot set SO_RCVBUF): it is never idle, only far too slow.
 */
const TRICKLER = `
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.connect(('127.0.0.1', int(sys.argv[1])))
s.sendall(('GET %s HTTP/1.1\\r\\nHost: a\\r\\n\\r\\n' % sys.argv[2]).encode())
while s.recv(4096):
    time.sleep(0.1)
`;
import type { ErrorBody } from '../src/api/wire.js';


describe.skipIf(!havePython)(`a client that trickles${havePython ? '' : ' (skipped: needs python3 for a socket with a small receive buffer)'}`, () => {
  it('has its connection closed once it took less than SEND_MIN_RATE of its waiting answer over SEND_TIMEOUT_SECONDS', async () => {
    // About 40 KiB/s taken, every 100 ms: below a 256 KiB/s minimum.
    const logs = capturedLogs<{ msg: string }>();
    const strict = await startTestServer({ config: { sendTimeoutSeconds: 1, sendMinRate: 256 * 1024 }, logger: logs.logger });
    const image = await strict.store.put(randomBytes(8 * 1024 ** 2), 'image/png');
    const client = spawn('python3', ['-c', TRICKLER, new URL(strict.origin).port, `/v1/images/files/${image.id}.png`]);
    const messages = () => logs.lines.map((line) => line.msg);
    try {
      // Cut for its rate long before the 8 MiB could go (about 200 s at its pace).
      await expect.poll(messages, { timeout: 15_000 }).toContain('the client took less than SEND_MIN_RATE of its answer over SEND_TIMEOUT_SECONDS: connection closed');
    } finally {
      client.kill();
      await strict.close();
    }
  }, 30_000);
});

describe('requests no route takes', () => {
  it('are answered 404 or 405 as they arrive, key or no key, their body neither waited for nor parsed', async () => {
    // Both at once: each then waits out the same request timeout, not one after the other.
    const cases = [['/nope', 404], ['/v1/models', 405]] as const;
    await Promise.all(
      cases.map(async ([path, status]) => {
        // A body declared and never sent: the answer cannot wait for it.
        const exchange = rawRequest(port, `POST ${path} HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{`);
        // An answer that waited for the body would be the request timeout's 408: the status tells them
        // apart, not how soon the poll sees it (a 2 s limit here was a loaded machine's turn or two).
        await expect.poll(() => exchange.text.includes('\r\n\r\n{')).toBe(true);
        expectOpenAiError(exchange.text, status, status === 404 ? null : 'method_not_allowed');
        // The request timeout ends the wait for the rest, with no second answer.
        await exchange.closed;
        expect(exchange.text.match(/HTTP\/1\.1 \d{3} /g)).toHaveLength(1);
      }),
    );
  });
});

/**
 * Streams `chunks` as a chunked request body after `head` until the server hangs up (or, `untilAnswered`,
 * answers); answers what was sent and heard.
 */
async function sendChunked(head: string, chunks: Iterable<Buffer>, untilAnswered = true): Promise<{ sent: number; text: string }> {
  // The patient server: over a 2 s request timeout, a loaded machine's 109 MiB got the timeout's 408, not the bound's 413.
  const exchange = rawRequest(patientPort, head);
  let sent = 0;
  let open = true;
  void exchange.closed.then(() => (open = false));
  for (const chunk of chunks) {
    if (!open || (untilAnswered && exchange.text)) break;
    const written = exchange.socket.write(Buffer.concat([Buffer.from(`${chunk.length.toString(16)}\r\n`), chunk, Buffer.from('\r\n')]));
    sent += chunk.length;
    if (!written) await Promise.race([new Promise((resolve) => exchange.socket.once('drain', resolve)), exchange.closed]);
  }
  await Promise.race([exchange.closed, new Promise((resolve) => setTimeout(resolve, 5000))]);
  exchange.socket.destroy();
  return { sent, text: exchange.text };
}

describe('multipart bodies', () => {
  const boundary = 'b0undary';
  const head = (length: string) =>
    `POST /v1/images/edits HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer ${TEST_KEY}\r\nContent-Type: multipart/form-data; boundary=${boundary}\r\n${length}\r\n\r\n`;
  const MiB = 1024 ** 2;
  /** Two files of 50 MiB, 64 fields of 128 KiB and 1 MiB of part headers: the most an edit's form takes. */
  const FORM_BOUND = 109 * MiB;
  function* junk(mebibytes: number) {
    for (let i = 0; i < mebibytes; i++) yield Buffer.alloc(MiB, 0x61);
  }

  it('over the largest form an endpoint takes, declared, get 413 before any of it is read', async () => {
    const exchange = rawRequest(port, head(`Content-Length: ${FORM_BOUND + 1}`));
    await expect.poll(() => exchange.text.includes('\r\n\r\n{')).toBe(true);
    const { headers, error } = expectOpenAiError(exchange.text, 413, 'request_too_large');
    expect(error.message).toBe('The multipart/form-data body is larger than any form this endpoint takes (at most 109 MiB).');
    // Its rest, sent after the answer, would be read and dropped: it is under LINGER_MAX_BYTES (128 MiB).
    expect(headers.connection).toBe('keep-alive');
    exchange.socket.destroy();
  });

  it('are counted whole, before the first part and after the last, which the form parser skips uncounted', async () => {
    // Junk before the first part: a 413 once past the bound, the rest unread. The connection closes with
    // the client's bytes unread, so TCP may reset it before the client reads the answer (Node has no
    // lingering close): the answer, when it arrives, is the 413.
    const before = await sendChunked(head('Transfer-Encoding: chunked'), junk(200));
    if (before.text) expectOpenAiError(before.text, 413, 'request_too_large');
    expect(before.sent).toBeLessThan(FORM_BOUND + 16 * MiB);

    // A whole form, then junk after its last boundary: the connection is cut once past the bound (the
    // request with it, if its answer was not sent yet).
    const png = await sharp({ create: { width: 64, height: 64, channels: 3, background: '#c00' } }).png().toBuffer();
    const form = Buffer.concat([
      Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="prompt"\r\n\r\na blue square\r\n`),
      Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="image"; filename="in.png"\r\nContent-Type: image/png\r\n\r\n`),
      png,
      Buffer.from(`\r\n--${boundary}--\r\n`),
    ]);
    const after = await sendChunked(head('Transfer-Encoding: chunked'), [form, ...junk(200)], false);
    expect(after.sent).toBeLessThan(FORM_BOUND + 16 * MiB);
  });
});

describe('uploads waiting for a worker', () => {
  it('hold at most UPLOAD_MEMORY together: a form that finds it full gets 429 unread, and gets in once they ended', async () => {
    const MiB = 1024 ** 2;
    // A fake engine: two edits are held waiting, their uploads kept, while a third comes.
    const held = await startTestServer({ engine: new FakeEngine(), config: { uploadMemory: 64 * MiB }, stubCanEdit: true });
    held.engine.hold();
    try {
      // An incompressible picture: a PNG of about 24 MiB, so two forms fit in 64 MiB and a third does not.
      const side = 2900;
      const noise = await sharp(randomBytes(side * side * 3), { raw: { width: side, height: side, channels: 3 } }).png({ compressionLevel: 0 }).toBuffer();
      expect(noise.length).toBeGreaterThan(22 * MiB);
      const edit = () => {
        const form = new FormData();
        form.set('prompt', 'a blue square');
        form.set('model', 'stub');
        form.set('image', new Blob([noise], { type: 'image/png' }), 'in.png');
        return fetch(`${held.baseURL}/images/edits`, { method: 'POST', headers: { authorization: `Bearer ${TEST_KEY}` }, body: form });
      };
      // Forms refused while their bodies arrive (an unknown file first, megabytes after it) give back
      // what they took.
      for (let i = 0; i < 20; i++) {
        const bad = new FormData();
        bad.set('photo', new Blob([noise.subarray(0, 4 * MiB)], { type: 'image/png' }), 'in.png');
        bad.set('image', new Blob([noise.subarray(0, 4 * MiB)], { type: 'image/png' }), 'in.png');
        const res = await fetch(`${held.baseURL}/images/edits`, { method: 'POST', headers: { authorization: `Bearer ${TEST_KEY}` }, body: bad }).catch(() => undefined);
        if (res) expect(res.status).toBe(400);
      }
      const waiting = [edit(), edit()];
      await expect.poll(() => held.engine.signals.length, { timeout: 30_000 }).toBe(2);
      const refused = await edit();
      expect([refused.status, refused.headers.get('retry-after')]).toEqual([429, '5']);
      expect((await refused.json()).error).toMatchObject({ type: 'requests', code: 'rate_limit_exceeded', message: expect.stringMatching(/UPLOAD_MEMORY, 64(\.0)? MiB/) });
      held.engine.release();
      expect((await Promise.all(waiting)).map((res) => res.status)).toEqual([200, 200]);
      // Their uploads went with them.
      expect((await edit()).status).toBe(200);
    } finally {
      held.engine.release();
      await held.close();
    }
  }, 60_000);
});

describe('JSON bodies arriving or waiting', () => {
  it('hold at most UPLOAD_MEMORY together with the forms: connections holding large bodies unfinished fill it, the next gets 429, and room comes back as they end', async () => {
    const MiB = 1024 ** 2;
    const server = await startTestServer({ engine: new FakeEngine(), config: { uploadMemory: 64 * MiB } });
    const port = Number(new URL(server.origin).port);
    // Bodies just under BODY_LIMIT (1 MiB), each sent but for its last byte: seventy would hold 70 MiB.
    // Before, each connection held its body for REQUEST_TIMEOUT_SECONDS, MAX_CONNECTIONS of them 4 GiB.
    const body = Buffer.from(JSON.stringify({ model: 'stub', prompt: 'x'.repeat(MiB - 100) }));
    const request = head(['POST /v1/images/generations HTTP/1.1', 'Host: 127.0.0.1', `Authorization: Bearer ${TEST_KEY}`, 'Content-Type: application/json', `Content-Length: ${body.length}`]);
    const holding: RawExchange[] = [];
    const hold = () => holding.push(rawRequest(port, Buffer.concat([Buffer.from(request), body.subarray(0, -1)])));
    for (let i = 0; i < 70; i++) hold();
    const uploadBytes = async () => metric(await scrape(server.origin, TEST_KEY), 'imagegen_upload_memory_bytes') ?? NaN;
    const generate = () =>
      fetch(`${server.baseURL}/images/generations`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${TEST_KEY}` },
        // Padded (JSON allows whitespace) past what the held bodies leave free, some KiB.
        body: JSON.stringify({ model: 'stub', prompt: 'a red circle', response_format: 'b64_json' }) + ' '.repeat(64 * 1024),
      });
    try {
      // Bodies arrive interleaved, so those refused part-way give back what they held: the memory can
      // settle with room for a generation (the bodies held whole being fewer than 64). Another holder
      // joins each time a generation still fits, until none does. The 429 looked at is the one the poll
      // saw: it may have come while bodies were still arriving, and a generation asked after it could
      // fit once those refused later gave back what they held.
      let refused: Response | undefined;
      await expect
        .poll(
          async () => {
            const answer = await generate();
            if (answer.status === 429) refused = answer;
            else hold();
            return answer.status;
          },
          { timeout: 20_000 },
        )
        .toBe(429);
      expect(refused!.headers.get('retry-after')).toBe('5');
      expect((await refused!.json()).error).toMatchObject({ type: 'requests', code: 'rate_limit_exceeded', message: expect.stringMatching(/UPLOAD_MEMORY, 64(\.0)? MiB/) });
      // What they hold is on /metrics.
      expect(await uploadBytes()).toBeGreaterThan(32 * MiB);
      // Those past it got the same 429 as their bodies came.
      await expect.poll(() => holding.filter((exchange) => exchange.text.startsWith('HTTP/1.1 429')).length).toBeGreaterThan(0);
      // A body declared over BODY_LIMIT gets its 413 however full the memory is: a 429 would have the
      // SDKs retry what can never pass.
      const tooLarge = rawRequest(port, request.replace(`Content-Length: ${body.length}`, `Content-Length: ${2 * MiB}`));
      await expect.poll(() => parseResponse(tooLarge.text).status).toBe('HTTP/1.1 413 Payload Too Large');
      tooLarge.socket.destroy();
      for (const exchange of holding) exchange.socket.destroy();
      await expect.poll(async () => (await generate()).status, { timeout: 20_000 }).toBe(200);
      await expect.poll(uploadBytes).toBe(0);
    } finally {
      for (const exchange of holding) exchange.socket.destroy();
      await server.close();
    }
  }, 60_000);
});

describe("one key's bodies", () => {
  it("leave room in UPLOAD_MEMORY for other keys' requests, whatever that key's own limits", async () => {
    const MiB = 1024 ** 2;
    // A key held to one request a minute: its bodies, never finished, are never counted against it.
    const mallory = 'sk-mallory-0123456789';
    const alice = 'sk-alice-0123456789';
    const server = await startTestServer({
      engine: new FakeEngine(),
      keysFile: `mallory:${mallory} requests_per_minute=1\nalice:${alice}\n`,
      // Its least: a key's share is the largest form (109 MiB), past half of it, which leaves 19 MiB to the others.
      config: { uploadMemory: 128 * MiB, bodyLimit: 2 * MiB },
    });
    const port = Number(new URL(server.origin).port);
    const post = (key: string, length: number) =>
      head(['POST /v1/images/generations HTTP/1.1', 'Host: 127.0.0.1', `Authorization: Bearer ${key}`, 'Content-Type: application/json', `Content-Length: ${length}`]);
    // Bodies of 1 MiB and a byte, sent but for that byte: 130 would hold 130 MiB, all of UPLOAD_MEMORY.
    // (One buffer sent on every connection: the test itself holds 1 MiB of them, not 130.)
    const body = Buffer.alloc(MiB, 0x20);
    const holding = Array.from({ length: 130 }, () => {
      const exchange = rawRequest(port, post(mallory, MiB + 1));
      exchange.socket.write(body);
      return exchange;
    });
    // Whether mallory is refused another such body as it is announced (the headers alone: the look takes no
    // memory). Once it is, mallory holds all but less than 1 MiB of the room it may take.
    const refusedMore = async () => {
      const look = rawRequest(port, post(mallory, MiB + 1));
      await Promise.race([once(look.socket, 'data'), look.closed, new Promise((resolve) => setTimeout(resolve, 1000))]);
      look.socket.destroy();
      return look.text.startsWith('HTTP/1.1 429') ? look.text : undefined;
    };
    try {
      await expect.poll(async () => (await refusedMore()) !== undefined, { timeout: 30_000 }).toBe(true);
      // Before, mallory's bodies filled all of it, and alice's requests got 429 for as long as mallory kept
      // that up (each round for REQUEST_TIMEOUT_SECONDS). A body of 1.25 MiB still fits beside them (more
      // than a body of mallory's given back can leave free).
      const generated = await fetch(`${server.baseURL}/images/generations`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${alice}` },
        body: JSON.stringify({ model: 'stub', prompt: 'a red circle', response_format: 'b64_json' }) + ' '.repeat(1.25 * MiB),
      });
      expect(generated.status).toBe(200);
      // Mallory is told why it is refused: its share, not a server that is full.
      const { error } = expectOpenAiError((await refusedMore())!, 429, 'rate_limit_exceeded');
      expect(error.message).toMatch(/this API key's requests hold as much .* as one key may \(109(\.0)? MiB of UPLOAD_MEMORY, 128(\.0)? MiB/);
    } finally {
      for (const exchange of holding) exchange.socket.destroy();
      await server.close();
    }
  }, 60_000);
});

describe('pipelined requests whose connection closes before their turn', () => {
  const MiB = 1024 ** 2;
  const post = (body: object) => {
    const text = JSON.stringify(body);
    return head(['POST /v1/images/generations HTTP/1.1', 'Host: 127.0.0.1', `Authorization: Bearer ${TEST_KEY}`, 'Content-Type: application/json', `Content-Length: ${Buffer.byteLength(text)}`]) + text;
  };
  /** A generation the engine holds: the answers pipelined behind it wait for its own, with no socket of theirs. */
  const slow = post({ model: 'stub', prompt: 'a red circle', response_format: 'b64_json' });

  it('give back their bodies\' UPLOAD_MEMORY', async () => {
    const engine = new FakeEngine(1, 100);
    engine.hold();
    const server = await startTestServer({ engine, config: { uploadMemory: 64 * MiB } });
    const port = Number(new URL(server.origin).port);
    // Bodies of about 1 MiB behind the held one, 80 MiB over eight connections (Node stops reading one
    // once its waiting answers pass 16 KiB): past UPLOAD_MEMORY, held while their answers wait.
    const queued = post({ model: 'stub', prompt: 'x'.repeat(MiB - 100), response_format: 'b64_json' });
    const exchanges = Array.from({ length: 8 }, () => rawRequest(port, slow + queued.repeat(10)));
    // Full once a body of their size is refused as it is announced: the headers alone, so that the look
    // takes no memory (one that took some while bodies arrived would leave room behind).
    const full = async () => {
      const look = rawRequest(port, queued.slice(0, queued.indexOf('\r\n\r\n') + 4));
      // A refusal comes as the headers arrive; a look let in waits for a body that never comes, so a
      // second (not a fixed 200 ms, which a loaded machine's answer could miss) ends that wait.
      await Promise.race([once(look.socket, 'data'), look.closed, new Promise((resolve) => setTimeout(resolve, 1000))]);
      look.socket.destroy();
      return look.text.startsWith('HTTP/1.1 429');
    };
    try {
      await expect.poll(full, { timeout: 20_000 }).toBe(true);
      for (const exchange of exchanges) exchange.socket.destroy();
      // Before, only the first request of each connection ended with it: the others kept their memory,
      // and every JSON body and form got 429 until the server restarted. A model that is not there: 400.
      const probe = async () =>
        (
          await fetch(`${server.baseURL}/images/generations`, {
            method: 'POST',
            headers: { 'content-type': 'application/json', authorization: `Bearer ${TEST_KEY}` },
            body: JSON.stringify({ model: 'not-installed', prompt: 'x'.repeat(MiB - 100) }),
          })
        ).status;
      await expect.poll(probe, { timeout: 20_000 }).toBe(400);
    } finally {
      for (const exchange of exchanges) exchange.socket.destroy();
      engine.release();
      await server.close();
    }
  }, 60_000);

  it('are cancelled, as a request whose client left', async () => {
    const engine = new FakeEngine(1, 100);
    engine.hold();
    const server = await startTestServer({ engine });
    const port = Number(new URL(server.origin).port);
    const exchange = rawRequest(port, slow + post({ model: 'stub', prompt: 'a blue square', response_format: 'b64_json' }).repeat(2));
    try {
      await expect.poll(() => engine.signals.length).toBe(3);
      exchange.socket.destroy();
      // Before, the two behind the first kept their places in the queue, and ran once it moved.
      await expect.poll(() => engine.signals.filter((signal) => signal?.aborted).length).toBe(3);
    } finally {
      engine.release();
      await server.close();
    }
  });
});

describe('an edit while the queue is full', () => {
  it('gets its 429 with Retry-After before its upload is read', async () => {
    // One worker, one waiting job: a running request and a waiting one fill it. A fake engine, to hold them there.
    const busy = await startTestServer({ engine: new FakeEngine(1, 1), stubCanEdit: true });
    busy.engine.hold();
    // No false alarms on the way: a b64_json edit's answer has more 'close' listeners than Node's default allows.
    const warnings: string[] = [];
    const onWarning = (warning: Error) => void warnings.push(`${warning.name}: ${warning.message}`);
    process.on('warning', onWarning);
    try {
      const generate = () => busy.client.images.generate({ model: 'stub', prompt: 'a red circle', response_format: 'b64_json' });
      const filling = [generate(), generate()];
      await expect.poll(() => busy.engine.load()).toEqual({ running: 1, queued: 1 });
      // A form declaring 20 MiB, of which only its head is sent: the answer must not wait for the rest.
      const boundary = 'b0undary';
      const start = `--${boundary}\r\nContent-Disposition: form-data; name="image"; filename="in.png"\r\nContent-Type: image/png\r\n\r\n`;
      const edit = rawRequest(
        Number(new URL(busy.origin).port),
        [
          'POST /v1/images/edits HTTP/1.1',
          'Host: 127.0.0.1',
          `Authorization: Bearer ${TEST_KEY}`,
          `Content-Type: multipart/form-data; boundary=${boundary}`,
          `Content-Length: ${20 * 1024 ** 2}`,
          '',
          start,
        ].join('\r\n'),
      );
      await expect.poll(() => edit.text.includes('\r\n\r\n{')).toBe(true);
      edit.socket.destroy();
      const { status, headers, body } = parseResponse(edit.text);
      expect([status, headers['retry-after']]).toEqual(['HTTP/1.1 429 Too Many Requests', expect.stringMatching(/^\d+$/)]);
      expect(JSON.parse(body).error).toMatchObject({ type: 'requests', code: 'rate_limit_exceeded', message: expect.stringMatching(/the generation queue is full/) });
      busy.engine.release();
      expect((await Promise.all(filling)).map((answer) => answer.data)).toHaveLength(2);
      // With room again, an edit is read and runs.
      const png = await sharp({ create: { width: 64, height: 64, channels: 3, background: 'red' } }).png().toBuffer();
      const edited = await busy.client.images.edit({ model: 'stub', prompt: 'a blue square', image: new File([png], 'in.png', { type: 'image/png' }), response_format: 'b64_json' });
      expect(edited.data).toHaveLength(1);
      await new Promise((resolve) => setImmediate(resolve));
      expect(warnings).toEqual([]);
    } finally {
      process.off('warning', onWarning);
      busy.engine.release();
      await busy.close();
    }
  });
});

describe('requests refused before routing', () => {
  it("are counted in /metrics under route before_routing, and each has one line naming its status and code (no route's hooks run for them)", async () => {
    const logs = capturedLogs<{ msg: string; reqId: string; status?: number; res?: { statusCode: number }; code?: string | null; clientError?: string; method?: string }>();
    const refusing = await startTestServer({ logger: logs.logger });
    const refusingPort = Number(new URL(refusing.origin).port);
    try {
      const raw = async (request: string) => {
        const exchange = rawRequest(refusingPort, request);
        await expect.poll(() => exchange.text.includes('\r\n\r\n{')).toBe(true);
        exchange.socket.destroy();
        return parseResponse(exchange.text).headers['x-request-id'];
      };
      const ids = {
        // Refused by Node's parser, and CONNECT, which Node hands to no route: answered by hand (errors.ts).
        malformed: await raw('HELLO\r\n\r\n'),
        headers: await raw(`GET /health HTTP/1.1\r\nHost: a\r\nX-Padding: ${'p'.repeat(20_000)}\r\n\r\n`),
        connect: await raw('CONNECT api.openai.com:443 HTTP/1.1\r\nHost: api.openai.com:443\r\n\r\n'),
        // Refused by Fastify's router: before, counted as 'unmatched' and logged with no 'request completed' line.
        percent: (await fetch(`${refusing.origin}/v1/models/%zz`)).headers.get('x-request-id'),
        long: (await fetch(`${refusing.origin}/v1/models/${'m'.repeat(MAX_PARAM_LENGTH + 1)}`)).headers.get('x-request-id'),
      };
      const text = await scrape(refusing.origin, TEST_KEY);
      const count = (method: string, status: number) => metric(text, `imagegen_http_requests_total{method="${method}",route="before_routing",status="${status}"}`);
      // Node's parser leaves no method to name: 'unknown'.
      expect([count('unknown', 400), count('unknown', 431), count('CONNECT', 405), count('GET', 400), count('GET', 414)]).toEqual([1, 1, 1, 1, 1]);
      expect(text).not.toMatch(/route="unmatched"/);
      const answered = (id: string | null | undefined) => logs.lines.filter((line) => line.reqId === id && (line.status !== undefined || line.res !== undefined));
      expect(answered(ids.malformed)).toEqual([expect.objectContaining({ msg: 'request refused before routing', status: 400, code: 'malformed_request', clientError: expect.stringMatching(/^HPE_/) })]);
      expect(answered(ids.headers)).toEqual([expect.objectContaining({ msg: 'request refused before routing', status: 431, code: 'request_header_fields_too_large', clientError: 'HPE_HEADER_OVERFLOW' })]);
      expect(answered(ids.connect)).toEqual([expect.objectContaining({ msg: 'request refused before routing', status: 405, code: 'method_not_allowed', method: 'CONNECT' })]);
      expect(answered(ids.percent)).toEqual([expect.objectContaining({ msg: 'request completed', res: { statusCode: 400 }, code: 'invalid_url' })]);
      expect(answered(ids.long)).toEqual([expect.objectContaining({ msg: 'request completed', res: { statusCode: 414 }, code: 'uri_too_long' })]);
    } finally {
      await refusing.close();
    }
  });
});

describe('content types and encodings', () => {
  const post = (body: string | Buffer, headers: Record<string, string>) =>
    fetch(`${server.baseURL}/images/generations`, { method: 'POST', headers: { authorization: `Bearer ${TEST_KEY}`, 'content-type': 'application/json', ...headers }, body: typeof body === 'string' ? body : new Uint8Array(body) });

  it('answers JSON sent as text/plain with 415', async () => {
    const res = await post(BODY, { 'content-type': 'text/plain' });
    expect(res.status).toBe(415);
    expect((await res.json()).error.code).toBe('unsupported_media_type');
  });

  it('decodes gzip, deflate and br bodies', async () => {
    for (const [encoding, data] of [['gzip', gzipSync(BODY)], ['deflate', deflateSync(BODY)], ['br', brotliCompressSync(BODY)], ['GZIP', gzipSync(BODY)]] as const) {
      const res = await post(data, { 'content-encoding': encoding });
      expect([encoding, res.status]).toEqual([encoding, 200]);
    }
  });

  it('answers a gzip bomb with 413, a corrupt body with 400 and an unknown encoding with 415', async () => {
    // 64 MiB of spaces inside a valid JSON object, 64 KiB compressed: far over the 1 MiB limit once decoded.
    const bomb = gzipSync(Buffer.concat([Buffer.from('{"prompt":"'), Buffer.alloc(64 * 1024 ** 2, 32), Buffer.from('"}')]));
    expect(bomb.length).toBeLessThan(1024 ** 2);
    const tooLarge = await post(bomb, { 'content-encoding': 'gzip' });
    expect(tooLarge.status).toBe(413);
    expect((await tooLarge.json()).error.code).toBe('request_too_large');
    const corrupt = await post(Buffer.from('not gzip at all'), { 'content-encoding': 'gzip' });
    expect(corrupt.status).toBe(400);
    expect((await corrupt.json()).error.code).toBe('invalid_content_encoding');
    const unknown = await post(BODY, { 'content-encoding': 'compress' });
    expect(unknown.status).toBe(415);
    expect((await unknown.json()).error.code).toBe('unsupported_content_encoding');
  });

  it('answers a compressed multipart form with 415: the form parser reads the body as sent, so it must come uncompressed', async () => {
    const boundary = 'b0undary';
    const form = Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="prompt"\r\n\r\na red circle\r\n--${boundary}--\r\n`);
    for (const body of [gzipSync(form), form]) {
      const res = await fetch(`${server.baseURL}/images/edits`, {
        method: 'POST',
        headers: { authorization: `Bearer ${TEST_KEY}`, 'content-type': `multipart/form-data; boundary=${boundary}`, 'content-encoding': 'gzip' },
        body: new Uint8Array(body),
      });
      expect(res.status).toBe(415);
      expect((await res.json()).error).toMatchObject({ code: 'unsupported_content_encoding', message: expect.stringContaining('send it uncompressed') });
    }
  });
});

describe('uploads the OpenAI SDK sends, refused before their body', () => {
  /**
   * The errors the OpenAI SDK raises for `count` edits of an incompressible 8 MiB picture made by a
   * client in a process of its own (in this one, the server's own turns let the client read the answer
   * before the connection was reset): each error's class name, or 'ok'.
   */
  async function editsFromAnotherProcess(baseURL: string, apiKey: string, count: number): Promise<string[]> {
    const script = `
      import OpenAI from 'openai';
      import { randomBytes } from 'node:crypto';
      import sharp from 'sharp';
      const side = 1700;
      const png = await sharp(randomBytes(side * side * 3), { raw: { width: side, height: side, channels: 3 } }).png({ compressionLevel: 0 }).toBuffer();
      const client = new OpenAI({ baseURL: ${JSON.stringify(baseURL)}, apiKey: ${JSON.stringify(apiKey)}, maxRetries: 0 });
      const names = [];
      for (let i = 0; i < ${count}; i++) {
        names.push(await client.images.edit({ model: 'stub', prompt: 'a blue square', image: new File([png], 'in.png', { type: 'image/png' }) }).then(() => 'ok', (err) => err.constructor.name));
      }
      console.log(JSON.stringify(names));`;
    // Not spawnSync: this process's server must answer meanwhile.
    const { stdout } = await promisify(execFile)(process.execPath, ['--input-type=module', '-e', script], { cwd: process.cwd(), encoding: 'utf8', timeout: 60_000 });
    return JSON.parse(stdout.trim().split('\n').at(-1)!) as string[];
  }

  it('reach the SDK as their status (AuthenticationError, NotFoundError, RateLimitError), not as a reset upload', async () => {
    // A fake engine: the queue is held full while the uploads come.
    const busy = await startTestServer({ engine: new FakeEngine(1, 1), stubCanEdit: true });
    try {
      // Before, the connection closed with the upload unread and the SDK saw a reset (APIConnectionError) nearly every time.
      expect(await editsFromAnotherProcess(busy.baseURL, 'sk-wrong-0000000000', 3)).toEqual(Array(3).fill('AuthenticationError'));
      expect(await editsFromAnotherProcess(busy.origin, TEST_KEY, 2)).toEqual(Array(2).fill('NotFoundError'));
      busy.engine.hold();
      const filling = [busy.client.images.generate({ model: 'stub', prompt: 'a red circle' }), busy.client.images.generate({ model: 'stub', prompt: 'a red circle' })];
      await expect.poll(() => busy.engine.load()).toEqual({ running: 1, queued: 1 });
      expect(await editsFromAnotherProcess(busy.baseURL, TEST_KEY, 2)).toEqual(Array(2).fill('RateLimitError'));
      busy.engine.release();
      await Promise.all(filling);
    } finally {
      busy.engine.release();
      await busy.close();
    }
  }, 120_000);
});

describe('MAX_CONNECTIONS', () => {
  it('resets a connection past it as it arrives (a fetch fails at once, not at its timeout), says so once, counts it, and serves again once one closes', async () => {
    const logs = capturedLogs<{ msg: string }>();
    const limited = await startTestServer({ config: { maxConnections: 3 }, logger: logs.logger });
    const held: net.Socket[] = [];
    try {
      const limitedPort = Number(new URL(limited.origin).port);
      const open = () =>
        new Promise<net.Socket>((resolve, reject) => {
          const socket = net.connect(limitedPort, '127.0.0.1', () => resolve(socket));
          held.push(socket);
          socket.once('error', reject);
        });
      const health = () => fetch(`${limited.origin}/health`, { signal: AbortSignal.timeout(5000) });
      const idle = [await open(), await open(), await open()];
      const started = performance.now();
      const refused = await health().catch((err: unknown) => err);
      expect(refused).toBeInstanceOf(TypeError);
      expect(String((refused as TypeError).cause)).toMatch(/ECONNRESET/);
      expect(performance.now() - started).toBeLessThan(4000);
      await expect(health()).rejects.toThrow();
      expect(logs.lines.filter((l) => l.msg.includes('MAX_CONNECTIONS'))).toEqual([
        expect.objectContaining({ msg: expect.stringMatching(/^1 connection reset as it arrived: MAX_CONNECTIONS \(3\) were open; raise it/) }),
      ]);
      // The held ones are still open and served.
      idle[0].write('GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n');
      expect(await new Promise((resolve) => idle[0].once('data', (chunk: Buffer) => resolve(chunk.toString().split('\r\n')[0])))).toBe('HTTP/1.1 200 OK');
      for (const socket of idle) socket.destroy();
      // Once they are gone, a client is served again, and the drops are counted.
      await expect.poll(async () => (await health().catch(() => undefined))?.status).toBe(200);
      const metrics = await (await fetch(`${limited.origin}/metrics`, { headers: { authorization: `Bearer ${TEST_KEY}` } })).text();
      // Two, or more where a retry of the poll came before the server saw the held ones close.
      expect(Number(/^imagegen_connections_dropped_total (\d+)$/m.exec(metrics)?.[1])).toBeGreaterThanOrEqual(2);
    } finally {
      for (const socket of held) socket.destroy();
      await limited.close();
    }
  });
});
