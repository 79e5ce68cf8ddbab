import http from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, TEST_KEY, type TestServer } from './helpers/api-server.js';
import type { ErrorBody } from '../src/api/wire.js';

/**
 * A server without API keys answers the programs of its own machine only: not a web page of another
 * site reaching it through a visitor's browser (DNS rebinding gives itself away by its Host, a posted
 * form by its Origin), nor the clients of a proxy in front of it. Each is a 403 saying what to do.
 */

/** GET /v1/models with `headers` (Host included: fetch may not set it), answering the status and the error's code. */
function get(server: TestServer, headers: Record<string, string>): Promise<{ status: number; code?: string | null; message?: string }> {
  const { port } = new URL(server.origin);
  return new Promise((resolve, reject) => {
    const request = http.get({ host: '127.0.0.1', port, path: '/v1/models', headers, agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8').on('data', (chunk: string) => (body += chunk));
      res.on('end', () => {
        const error = res.statusCode === 200 ? undefined : (JSON.parse(body) as ErrorBody).error;
        resolve({ status: res.statusCode!, code: error?.code, message: error?.message });
      });
    });
    request.on('error', reject);
  });
}

describe('a server without API keys', () => {
  let keyless: TestServer;
  let opened: TestServer;
  let keyed: TestServer;
  beforeAll(async () => {
    // The test servers trust X-Forwarded-For from any peer (TRUST_PROXY=true).
    keyless = await startTestServer({ apiKeys: [] });
    opened = await startTestServer({ apiKeys: [], config: { corsOrigins: ['https://app.example'] } });
    keyed = await startTestServer();
  });
  afterAll(async () => {
    await Promise.all([keyless, opened, keyed].map((server) => server.close()));
  });

  it('answers its own machine by the loopback names, and refuses other names (DNS rebinding)', async () => {
    const port = new URL(keyless.origin).port;
    // As browsers and curl write them too: upper case, a trailing dot, IPv6's long and IPv4-mapped forms.
    const loopbackNames = [`127.0.0.1:${port}`, `localhost:${port}`, `[::1]:${port}`, `api.localhost:${port}`, '127.0.0.2', `LOCALHOST.:${port}`, '[0:0:0:0:0:0:0:1]', `[::ffff:7f00:1]:${port}`];
    for (const host of loopbackNames) {
      expect((await get(keyless, { host })).status, host).toBe(200);
    }
    const rebound = await get(keyless, { host: `rebind.attacker.example:${port}` });
    expect(rebound).toMatchObject({ status: 403, code: 'local_clients_only' });
    expect(rebound.message).toMatch(/no API keys.*names 'rebind\.attacker\.example:\d+'.*set API_KEYS/);
    // The OpenAI SDK, as a local program uses it, is answered.
    expect((await keyless.client.models.list()).data.length).toBeGreaterThan(0);
  });

  it("refuses pages of other sites (a posted form needs no preflight), and takes its own and CORS_ORIGINS' pages", async () => {
    const host = `localhost:${new URL(keyless.origin).port}`;
    const foreign = await get(keyless, { host, origin: 'https://attacker.example' });
    expect(foreign).toMatchObject({ status: 403, code: 'local_clients_only' });
    expect(foreign.message).toMatch(/web pages of other sites.*'https:\/\/attacker\.example'.*CORS_ORIGINS/);
    expect((await get(keyless, { host, origin: 'null' })).status).toBe(403);
    expect((await get(keyless, { host, origin: keyless.origin })).status).toBe(200);
    expect((await get(keyless, { host, origin: 'http://localhost:3000' })).status).toBe(200);
    expect((await get(keyless, { host, origin: 'http://[::ffff:7f00:1]:3000' })).status).toBe(200);
    expect((await get(keyless, { host, origin: 'http://localhost.attacker.example' })).status).toBe(403);
    expect((await get(opened, { host, origin: 'https://app.example' })).status).toBe(200);
    expect((await get(opened, { host, origin: 'https://attacker.example' })).status).toBe(403);
    // "*" opens a keyless server to no page (config.ts refuses it there: it would open it to every one).
    const starred = await startTestServer({ apiKeys: [], config: { corsOrigins: ['*'] } });
    try {
      expect((await get(starred, { host, origin: 'https://attacker.example' })).status).toBe(403);
    } finally {
      await starred.close();
    }
  });

  it("refuses a proxy's clients, unless TRUST_PROXY says the client is on the machine", async () => {
    const host = `localhost:${new URL(keyless.origin).port}`;
    const proxied = await get(keyless, { host, 'x-forwarded-for': '203.0.113.9' });
    expect(proxied).toMatchObject({ status: 403, code: 'local_clients_only' });
    expect(proxied.message).toMatch(/came through a proxy.*Set API_KEYS/);
    expect((await get(keyless, { host, forwarded: 'for=203.0.113.9' })).status).toBe(403);
    expect((await get(keyless, { host, 'x-real-ip': '203.0.113.9' })).status).toBe(403);
    expect((await get(keyless, { host, 'x-forwarded-for': '127.0.0.1' })).status).toBe(200);
    // A client elsewhere writing a loopback entry of its own in front of the one its proxy adds.
    expect((await get(keyless, { host, 'x-forwarded-for': '127.0.0.1, 203.0.113.9' })).status).toBe(403);
    expect((await get(keyless, { host, 'x-forwarded-for': 'localhost' })).status).toBe(403);
    // A proxy that names no client, only the address the client used (nginx with X-Forwarded-Host and
    // -Proto but no X-Forwarded-For, as the README's block was): the client may be anywhere, and it chose
    // the Host the proxy passes on.
    const unnamed = await get(keyless, { host, 'x-forwarded-host': host, 'x-forwarded-proto': 'http' });
    expect(unnamed).toMatchObject({ status: 403, code: 'local_clients_only' });
    expect(unnamed.message).toMatch(/came through a proxy/);
    expect((await get(keyless, { host, 'x-forwarded-proto': 'https' })).status).toBe(403);
    expect((await get(keyless, { host, 'x-forwarded-host': 'localhost' })).status).toBe(403);
    // The same proxy naming a client on the machine in X-Forwarded-For is answered.
    expect((await get(keyless, { host, 'x-forwarded-for': '127.0.0.1', 'x-forwarded-host': host, 'x-forwarded-proto': 'http' })).status).toBe(200);
  });

  it('refuses the clients of a proxy on the machine that TRUST_PROXY does not name: what it says of them is unread, not taken as a local client', async () => {
    // TRUST_PROXY names a proxy elsewhere; a second one on this machine (loopback) is not among them.
    const elsewhere = await startTestServer({ apiKeys: [], config: { trustProxy: ['10.0.0.0/8'] } });
    try {
      const host = `localhost:${new URL(elsewhere.origin).port}`;
      expect(await get(elsewhere, { host, 'x-forwarded-for': '203.0.113.9' })).toMatchObject({ status: 403, code: 'local_clients_only' });
      expect((await get(elsewhere, { host })).status).toBe(200);
    } finally {
      await elsewhere.close();
    }
  });

  it('leaves a server with keys to its keys', async () => {
    const answer = await get(keyed, { host: 'images.example.com', origin: 'https://attacker.example', 'x-forwarded-for': '203.0.113.9', authorization: `Bearer ${TEST_KEY}` });
    expect(answer.status).toBe(200);
  });
});
