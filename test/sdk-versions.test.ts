import { once } from 'node:events';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, TEST_KEY, type TestServer } from './helpers/api-server.js';
import { FakeEngine } from './helpers/engines.js';
import { capturedLogs } from './helpers/logs.js';
import { parseResponse, rawRequest } from './helpers/raw-http.js';
import sharp from 'sharp';

/**
 * What older openai-node majors send, as they send it (headers copied from openai 4.104.0 and 5.0.0 on
 * Node 20): the project's own devDependency is the current major, and the older ones differ in ways a
 * server must meet.
 */

const KEY = 'sk-limited-0123456789';

const picture = () => sharp({ create: { width: 64, height: 64, channels: 3, background: { r: 255, g: 0, b: 0 } } }).png().toBuffer();

/** The headers every request of openai-node `version` on Node carries. */
const sdkHeaders = (version: string): Record<string, string> => ({
  authorization: `Bearer ${KEY}`,
  accept: 'application/json',
  'user-agent': `OpenAI/JS ${version}`,
  'x-stainless-lang': 'js',
  'x-stainless-package-version': version,
  'x-stainless-os': 'Linux',
  'x-stainless-arch': 'x64',
  'x-stainless-runtime': 'node',
  'x-stainless-runtime-version': 'v20.20.2',
  'x-stainless-retry-count': '0',
});

describe('openai-node 4.x, whose retry of a form sends no body', () => {
  let server: TestServer;
  beforeAll(async () => {
    // One request a minute: the second is a 429 that the SDKs retry after its Retry-After.
    server = await startTestServer({ keysFile: `limited:${KEY} requests_per_minute=1\n` });
    const first = await fetch(`${server.baseURL}/images/generations`, {
      method: 'POST',
      headers: { ...sdkHeaders('4.104.0'), 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'stub', prompt: 'a red circle', response_format: 'b64_json' }),
    });
    expect(first.status).toBe(200);
  });
  afterAll(() => server.close());

  /** An edit or variation form as openai-node builds it: text fields, then the file. */
  const sendForm = async (path: string, version: string) => {
    const form = new FormData();
    if (path === '/images/edits') form.append('prompt', 'a blue square');
    form.append('n', '2');
    form.append('image', new Blob([await picture()], { type: 'image/png' }), 'in.png');
    return fetch(`${server.baseURL}${path}`, { method: 'POST', headers: sdkHeaders(version), body: form });
  };

  it('is told not to retry a refused edit or variation, which it would resend empty and get a 408 for minutes later', async () => {
    for (const path of ['/images/edits', '/images/variations']) {
      for (const version of ['4.104.0', '4.0.0']) {
        const refused = await sendForm(path, version);
        expect(refused.status).toBe(429);
        expect(refused.headers.get('x-should-retry')).toBe('false');
        // The caller still learns when to try again.
        expect(Number(refused.headers.get('retry-after'))).toBeGreaterThan(0);
        expect((await refused.json()).error).toMatchObject({ code: 'rate_limit_exceeded', type: 'requests' });
      }
    }
  });

  it('keeps its retries where they work: its JSON requests, and forms from openai-node 5 and later (a FormData, resent whole)', async () => {
    const json = await fetch(`${server.baseURL}/images/generations`, {
      method: 'POST',
      headers: { ...sdkHeaders('4.104.0'), 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'stub', prompt: 'a red circle' }),
    });
    expect(json.status).toBe(429);
    expect(json.headers.get('x-should-retry')).toBeNull();
    await json.arrayBuffer();
    for (const version of ['5.0.0', '6.49.0']) {
      const refused = await sendForm('/images/edits', version);
      expect(refused.status).toBe(429);
      expect(refused.headers.get('x-should-retry')).toBeNull();
      await refused.arrayBuffer();
    }
    // openai 4.x in a browser (its FormData shim) reports another runtime, and retries as well.
    const form = new FormData();
    form.append('prompt', 'x');
    form.append('image', new Blob([await picture()], { type: 'image/png' }), 'in.png');
    const browser = await fetch(`${server.baseURL}/images/edits`, { method: 'POST', headers: { ...sdkHeaders('4.104.0'), 'x-stainless-runtime': 'browser:chrome' }, body: form });
    expect(browser.status).toBe(429);
    expect(browser.headers.get('x-should-retry')).toBeNull();
    await browser.arrayBuffer();
  });

  it('is told not to retry a form refused before its body is parsed: the 503 of a server shutting down', async () => {
    const logs = capturedLogs<{ msg: string }>();
    const shutting = await startTestServer({ engine: new FakeEngine(), logger: logs.logger });
    const port = Number(new URL(shutting.origin).port);
    const headers = { ...sdkHeaders('4.104.0'), authorization: `Bearer ${TEST_KEY}` };
    // The SDK's request, its first line sent before the close begins and the rest during it (a connection
    // idle then is closed, as is one whose answer comes during the close). It must be the server's when the
    // close begins (one still waiting to be accepted is reset as the port closes): it connects first, and the
    // server takes connections in the order they came, so it has this one once it has `other`'s request.
    // Node counts a connection it took whose request has not ended as busy, its first line read or not.
    const spare = rawRequest(port, 'POST /v1/images/edits HTTP/1.1\r\n');
    await once(spare.socket, 'connect');
    // Another client's request still arriving: the shutdown waits for it. Its 100 Continue says the server
    // has taken it (its body is being read) before the close begins.
    const other = rawRequest(port, `POST /v1/images/generations HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${TEST_KEY}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\nExpect: 100-continue\r\n\r\n`);
    try {
      await expect.poll(() => other.text).toMatch(/^HTTP\/1\.1 100 Continue\r\n\r\n$/);
      const closed = shutting.close();
      // The close has begun: what arrives now is refused (the line comes once the shutdown counts `other` in flight).
      await expect.poll(() => logs.lines.some((line) => line.msg === 'waiting for requests in flight to finish')).toBe(true);
      const form = new FormData();
      form.append('prompt', 'a blue square');
      form.append('image', new Blob([await picture()], { type: 'image/png' }), 'in.png');
      const encoded = new Request('http://x', { method: 'POST', body: form });
      const body = Buffer.from(await encoded.arrayBuffer());
      const head = Object.entries({ ...headers, host: '127.0.0.1', 'content-type': encoded.headers.get('content-type')!, 'content-length': String(body.length) }).map(([name, value]) => `${name}: ${value}\r\n`);
      spare.socket.write(Buffer.concat([Buffer.from(`${head.join('')}\r\n`), body]));
      await expect.poll(() => spare.text).toMatch(/"code":"server_shutting_down"}}$/);
      const refused = parseResponse(spare.text);
      expect([refused.status, JSON.parse(refused.body).error.code]).toEqual(['HTTP/1.1 503 Service Unavailable', 'server_shutting_down']);
      expect(refused.headers['x-should-retry']).toBe('false');
      other.socket.destroy();
      await closed;
    } finally {
      other.socket.destroy();
      spare.socket.destroy();
    }
  });
});
