import http from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, TEST_KEY, type TestServer } from './helpers/api-server.js';

/**
 * Image URLs under forged Host, X-Forwarded-Host and X-Forwarded-Proto: every URL the server hands out
 * parses, is http(s), and names the host the client reached (or, behind a trusted proxy, the proxy's
 * valid forwarded host); a Host that is not host[:port] gets 400.
 */

let direct: TestServer; // TRUST_PROXY unset: forwarded headers are ignored
let proxied: TestServer; // TRUST_PROXY=127.0.0.1: the test process is the proxy
beforeAll(async () => {
  direct = await startTestServer({ config: { trustProxy: false } });
  proxied = await startTestServer({ config: { trustProxy: ['127.0.0.1'] } });
});
afterAll(async () => {
  await direct.close();
  await proxied.close();
});

/** POSTs a generation with exactly these headers (fetch would not send a forged Host). */
function generate(server: TestServer, headers: Record<string, string>): Promise<{ status: number; body: { data?: { url: string }[]; error?: { code: string } } }> {
  const { port } = new URL(server.origin);
  const body = JSON.stringify({ model: 'stub', prompt: 'x', response_format: 'url' });
  return new Promise((resolve, reject) => {
    const request = http.request(
      { host: '127.0.0.1', port, method: 'POST', path: '/v1/images/generations', setHost: false, headers: { authorization: `Bearer ${TEST_KEY}`, 'content-type': 'application/json', ...headers } },
      (res) => {
        let text = '';
        res.on('data', (chunk) => (text += chunk));
        res.on('end', () => resolve({ status: res.statusCode!, body: JSON.parse(text) }));
      },
    );
    request.on('error', reject);
    request.end(body);
  });
}

const evilHosts = [
  '127.0.0.1:1@evil.example',
  'evil.example/path',
  'evil.example?x=1',
  'evil.example#frag',
  '<script>alert(1)</script>',
  '"><img src=x onerror=alert(1)>',
  'javascript:alert(1)',
  'evil.example:99999',
  'evil.example:0',
  '[::1',
  '[not-ipv6]',
  'a b',
  'evil.example\\@good',
  '999.1.1.1',
  'user:pass@evil.example',
  'evil.example:80:80',
];
const evilProtocols = ['javascript', 'file', 'data', 'https://evil.example', 'ftp', 'http, javascript', 'vbscript', ''];

interface Row {
  name: string;
  headers: Record<string, string>;
  /** For each server: the URL's expected protocol and host, or 400. */
  direct: string | 400;
  proxied: string | 400;
}

const rows: Row[] = [
  ...evilHosts.map((host): Row => ({ name: `Host: ${host}`, headers: { host }, direct: 400, proxied: 400 })),
  ...evilHosts.map((host): Row => ({ name: `X-Forwarded-Host: ${host}`, headers: { host: 'api.example:8000', 'x-forwarded-host': host }, direct: 'http://api.example:8000', proxied: 'http://api.example:8000' })),
  ...evilProtocols.map((proto): Row => ({ name: `X-Forwarded-Proto: ${proto}`, headers: { host: 'api.example', 'x-forwarded-proto': proto }, direct: 'http://api.example', proxied: 'http://api.example' })),
  { name: 'a valid forwarded host and protocol', headers: { host: 'backend:8000', 'x-forwarded-host': 'images.example.com', 'x-forwarded-proto': 'https' }, direct: 'http://backend:8000', proxied: 'https://images.example.com' },
  { name: 'a list of forwarded hosts: the last, the nearest proxy\'s', headers: { host: 'backend', 'x-forwarded-host': 'evil.example, images.example.com' }, direct: 'http://backend', proxied: 'http://images.example.com' },
  { name: 'an IPv6 Host', headers: { host: '[::1]:8000' }, direct: 'http://[::1]:8000', proxied: 'http://[::1]:8000' },
  { name: 'a container name with an underscore', headers: { host: 'image_gen:8000' }, direct: 'http://image_gen:8000', proxied: 'http://image_gen:8000' },
];

describe('image URLs under forged headers', () => {
  it(`holds for ${rows.length} forgeries`, async () => {
    expect(rows.length).toBeGreaterThanOrEqual(20);
    for (const row of rows) {
      for (const [server, expected] of [[direct, row.direct], [proxied, row.proxied]] as const) {
        const { status, body } = await generate(server, row.headers);
        const context = `${row.name} (${server === direct ? 'no proxy trusted' : 'proxy trusted'}): ${status} ${JSON.stringify(body)}`;
        if (expected === 400) {
          expect(status, context).toBe(400);
          expect(body.error?.code, context).toBe('invalid_host_header');
          continue;
        }
        expect(status, context).toBe(200);
        const url = new URL(body.data![0].url);
        expect(['http:', 'https:'], context).toContain(url.protocol);
        expect([url.origin, url.username, url.password, url.search, url.hash], context).toEqual([expected, '', '', '', '']);
        expect(url.pathname, context).toMatch(/^\/v1\/images\/files\/[0-9a-f]{32}\.png$/);
      }
    }
  });

  it('uses PUBLIC_BASE_URL whatever the headers say', async () => {
    const fixed = await startTestServer({ config: { trustProxy: true, publicBaseUrl: 'https://img.example.com' } });
    try {
      const { body } = await generate(fixed, { host: 'api.example', 'x-forwarded-host': 'evil.example', 'x-forwarded-proto': 'http' });
      expect(new URL(body.data![0].url).origin).toBe('https://img.example.com');
    } finally {
      await fixed.close();
    }
  });
});
