import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../src/config.js';
import { ConfigError } from '../src/util/config-error.js';
import { startTestServer, TEST_KEY, type TestServer } from './helpers/api-server.js';

/**
 * CORS as a browser exercises it, with plain fetch (Node's fetch sends Origin as given and enforces
 * nothing, so the headers themselves are checked): preflights answered without a key for the allowed
 * origins only, every route's answers (image files and errors included) readable by them, nothing
 * without CORS_ORIGINS.
 */

const ALLOWED = 'https://app.example.com';
const OTHER = 'https://evil.example.com';

/** What the OpenAI SDK's fetch in a browser asks before its POST. */
const preflight = (url: string, origin: string) =>
  fetch(url, {
    method: 'OPTIONS',
    headers: {
      origin,
      'access-control-request-method': 'POST',
      'access-control-request-headers': 'authorization, content-type, x-stainless-os, x-stainless-retry-count',
    },
  });

const corsHeaders = (res: Response) => [...res.headers.keys()].filter((name) => name.startsWith('access-control-'));

let server: TestServer;
let open: TestServer;
let closed: TestServer;
beforeAll(async () => {
  [server, open, closed] = await Promise.all([
    startTestServer({ config: { corsOrigins: [ALLOWED, 'http://localhost:5173'] } }),
    startTestServer({ config: { corsOrigins: ['*'] } }),
    startTestServer(),
  ]);
});
afterAll(() => Promise.all([server, open, closed].map((s) => s.close())));

async function imageUrl(target: TestServer): Promise<string> {
  const { data } = await target.client.images.generate({ model: 'stub', prompt: 'a red circle' });
  return data![0].url!;
}

describe('with CORS_ORIGINS', () => {
  it('answers a preflight from an allowed origin on every route, without a key', async () => {
    const urls = [
      `${server.baseURL}/images/generations`,
      `${server.baseURL}/models`,
      `${server.baseURL}/models/stub`,
      await imageUrl(server),
      `${server.origin}/health`,
    ];
    for (const url of urls) {
      const res = await preflight(url, ALLOWED);
      expect(res.status, url).toBe(204);
      expect(res.headers.get('access-control-allow-origin')).toBe(ALLOWED);
      expect(res.headers.get('access-control-allow-methods')).toBe('GET, HEAD, POST');
      expect(res.headers.get('access-control-allow-headers')).toBe('authorization, content-type, x-stainless-os, x-stainless-retry-count');
      expect(res.headers.get('access-control-max-age')).toBe('600');
      expect(res.headers.get('vary')).toMatch(/Origin/);
      expect(res.headers.has('access-control-allow-credentials')).toBe(false);
    }
  });

  it('gives another origin no CORS headers, and its preflight the 405 any OPTIONS gets', async () => {
    const res = await preflight(`${server.baseURL}/images/generations`, OTHER);
    expect(res.status).toBe(405);
    expect(corsHeaders(res)).toEqual([]);
    expect((await res.json()).error).toMatchObject({ code: 'method_not_allowed', param: null, type: 'invalid_request_error' });
    expect(res.headers.get('allow')).toBe('POST');
  });

  it('lets the allowed page read a generation, its request id and its errors', async () => {
    const post = (key: string) =>
      fetch(`${server.baseURL}/images/generations`, {
        method: 'POST',
        headers: { origin: ALLOWED, authorization: `Bearer ${key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'stub', prompt: 'a red circle', response_format: 'b64_json' }),
      });
    const ok = await post(TEST_KEY);
    expect(ok.status).toBe(200);
    expect(ok.headers.get('access-control-allow-origin')).toBe(ALLOWED);
    expect(ok.headers.get('access-control-expose-headers')).toBe(
      'x-request-id, openai-processing-ms, retry-after, x-should-retry, ' +
        'x-ratelimit-limit-requests, x-ratelimit-remaining-requests, x-ratelimit-reset-requests, x-ratelimit-limit-images, x-ratelimit-remaining-images, x-ratelimit-reset-images',
    );

    const refused = await post('sk-wrong-key-000000');
    expect(refused.status).toBe(401);
    expect(refused.headers.get('access-control-allow-origin')).toBe(ALLOWED);
    expect((await refused.json()).error).toMatchObject({ code: 'invalid_api_key', param: null, type: 'invalid_request_error' });
  });

  it('lets image URLs load cross-origin for allowed origins only', async () => {
    const url = await imageUrl(server);
    const allowed = await fetch(url, { headers: { origin: 'http://localhost:5173' } });
    expect(allowed.status).toBe(200);
    expect(allowed.headers.get('access-control-allow-origin')).toBe('http://localhost:5173');
    const other = await fetch(url, { headers: { origin: OTHER } });
    expect(other.status).toBe(200);
    expect(corsHeaders(other)).toEqual([]);
  });

  it('keeps 404 for unknown URLs and 405 for other methods', async () => {
    const unknown = await fetch(`${server.baseURL}/nothing`, { headers: { origin: ALLOWED } });
    expect(unknown.status).toBe(404);
    expect((await unknown.json()).error).toMatchObject({ code: null, param: null });
    const wrongMethod = await fetch(`${server.baseURL}/images/generations`, { method: 'DELETE', headers: { authorization: `Bearer ${TEST_KEY}` } });
    expect(wrongMethod.status).toBe(405);
    expect(wrongMethod.headers.get('allow')).toBe('POST');
  });
});

describe('with CORS_ORIGINS=*', () => {
  it('allows any origin, preflights and image files alike', async () => {
    const res = await preflight(`${open.baseURL}/images/generations`, OTHER);
    expect(res.status).toBe(204);
    expect(res.headers.get('access-control-allow-origin')).toBe('*');
    const file = await fetch(await imageUrl(open), { headers: { origin: OTHER } });
    expect(file.headers.get('access-control-allow-origin')).toBe('*');
  });
});

describe('an OPTIONS request that is no preflight (no Access-Control-Request-Method)', () => {
  it('gets the 405 (404 for an unknown URL) in OpenAI\'s shape that any OPTIONS gets, with its CORS headers, from an allowed origin or none', async () => {
    // Before, @fastify/cors answered these with a plain-text 400 'Invalid Preflight Request'.
    for (const [target, origin] of [[server, ALLOWED], [open, OTHER], [open, undefined]] as const) {
      const res = await fetch(`${target.baseURL}/models`, { method: 'OPTIONS', headers: origin ? { origin } : {} });
      expect(res.status).toBe(405);
      expect(res.headers.get('allow')).toBe('GET, HEAD');
      expect(res.headers.get('access-control-allow-origin')).toBe(target === open ? '*' : ALLOWED);
      expect(res.headers.has('access-control-allow-methods')).toBe(false);
      expect((await res.json()).error).toMatchObject({ code: 'method_not_allowed', param: null, type: 'invalid_request_error' });
    }
    const unknown = await fetch(`${server.baseURL}/nothing`, { method: 'OPTIONS', headers: { origin: ALLOWED } });
    expect(unknown.status).toBe(404);
    expect((await unknown.json()).error).toMatchObject({ message: 'Invalid URL (OPTIONS /v1/nothing)', code: null });
  });
});

describe('without CORS_ORIGINS', () => {
  it('sends no CORS headers anywhere', async () => {
    const res = await preflight(`${closed.baseURL}/images/generations`, ALLOWED);
    expect(res.status).toBe(405);
    expect(corsHeaders(res)).toEqual([]);
    const file = await fetch(await imageUrl(closed), { headers: { origin: ALLOWED } });
    expect(file.status).toBe(200);
    expect(corsHeaders(file)).toEqual([]);
  });
});

describe('CORS_ORIGINS setting', () => {
  it('is off by default and takes origins as browsers write them', () => {
    expect(loadConfig({}, {}).corsOrigins).toEqual([]);
    expect(loadConfig({}, { CORS_ORIGINS: 'https://App.Example.com/, http://localhost:5173' }).corsOrigins).toEqual(['https://app.example.com', 'http://localhost:5173']);
    expect(loadConfig({ corsOrigins: '*' }, { API_KEYS: 'sk-a' }).corsOrigins).toEqual(['*']);
  });

  it('refuses * on a server without keys: every page a browser on the machine opened could use it', () => {
    let error: unknown;
    try {
      loadConfig({ corsOrigins: '*' }, {});
    } catch (err) {
      error = err;
    }
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).problems).toEqual([expect.stringMatching(/^CORS_ORIGINS is \* but no API_KEYS or API_KEYS_FILE are set: .*Name the origins .* or set API_KEYS\.$/)]);
    expect(loadConfig({ corsOrigins: '*' }, { API_KEYS_FILE: 'keys.txt' }).corsOrigins).toEqual(['*']);
    expect(loadConfig({}, { CORS_ORIGINS: 'http://localhost:5173' }).corsOrigins).toEqual(['http://localhost:5173']);
  });

  it('refuses what is not an origin, naming the setting and the form expected', () => {
    for (const value of ['https://app.example.com/path', 'app.example.com', 'ftp://files.example.com']) {
      let error: unknown;
      try {
        loadConfig({}, { CORS_ORIGINS: value });
      } catch (err) {
        error = err;
      }
      expect(error).toBeInstanceOf(ConfigError);
      expect((error as ConfigError).problems[0]).toMatch(/^CORS_ORIGINS \(--cors-origins\): '.+' is not an origin: expected \* or origins such as https:\/\/app\.example\.com/);
    }
  });
});
