import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import Fastify from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { errors } from '../src/http/errors.js';
import { PLAYGROUND_DIR, playground } from '../src/http/playground.js';
import { Metrics } from '../src/observability/metrics.js';
import { startTestServer, type TestServer } from './helpers/api-server.js';
import type { ErrorBody } from '../src/api/wire.js';

/**
 * The playground page as HTTP serves it (the global setup builds the bundle as `npm run build` does):
 * at / and /playground/ without a key while the API keeps needing one, revalidated by ETag, only
 * this server's own resources, and off with PLAYGROUND=false. The page itself: playground-browser.test.ts.
 */

describe('the playground page', () => {
  let server: TestServer;

  beforeAll(async () => {
    server = await startTestServer();
  });
  afterAll(() => server.close());

  it('is served at / and /playground/ without a key, while the API still needs one', async () => {
    for (const page of ['/', '/playground/']) {
      const res = await fetch(`${server.origin}${page}`);
      expect(res.status).toBe(200);
      expect(res.headers.get('content-type')).toBe('text/html; charset=utf-8');
      expect(await res.text()).toContain('<script type="module" src="/playground/app.js"></script>');
    }
    const redirect = await fetch(`${server.origin}/playground`, { redirect: 'manual' });
    expect([redirect.status, redirect.headers.get('location')]).toEqual([308, '/playground/']);
    for (const asset of ['app.js', 'app.css']) expect((await fetch(`${server.origin}/playground/${asset}`)).status).toBe(200);
    expect((await fetch(`${server.baseURL}/models`)).status).toBe(401);
  });

  it('is cached by browsers and revalidated by its ETag (304 without the body)', async () => {
    const first = await fetch(`${server.origin}/playground/app.js`);
    expect(first.headers.get('cache-control')).toBe('no-cache');
    expect(first.headers.get('content-type')).toBe('text/javascript; charset=utf-8');
    const etag = first.headers.get('etag')!;
    expect(etag).toMatch(/^"[\w-]{22}"$/);
    const again = await fetch(`${server.origin}/playground/app.js`, { headers: { 'if-none-match': etag } });
    expect(again.status).toBe(304);
    expect(await again.text()).toBe('');
    expect((await fetch(`${server.origin}/playground/app.js`, { headers: { 'if-none-match': '"other"' } })).status).toBe(200);
  });

  it('loads nothing from elsewhere: no URL to another host in the bundle, and a policy that forbids it', async () => {
    const page = await fetch(`${server.origin}/`);
    expect(page.headers.get('content-security-policy')).toBe(
      "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self' blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    );
    // A PUBLIC_BASE_URL with a path is allowed by its origin: a source with a path would allow that path only, not the images under it.
    const behindProxy = await startTestServer({ config: { publicBaseUrl: 'https://cdn.example.com/imagegen' } });
    try {
      expect((await fetch(`${behindProxy.origin}/`)).headers.get('content-security-policy')).toContain("img-src 'self' https://cdn.example.com data: blob:; connect-src 'self' https://cdn.example.com blob:;");
    } finally {
      await behindProxy.close();
    }
    for (const name of await readdir(PLAYGROUND_DIR)) {
      if (name.endsWith('.map')) continue;
      const text = await readFile(path.join(PLAYGROUND_DIR, name), 'utf8');
      expect(text.match(/(https?:)?\/\/[a-z0-9.-]+\.[a-z]{2,}/gi) ?? [], name).toEqual([]);
    }
  });

  it('is a small bundle', async () => {
    const js = await readFile(path.join(PLAYGROUND_DIR, 'app.js'));
    const css = await readFile(path.join(PLAYGROUND_DIR, 'app.css'));
    expect(js.length + css.length).toBeLessThan(64 * 1024);
  });

  it('answers 404 for files it does not have, and never reads a path from the request', async () => {
    for (const name of ['missing.js', '..%2Fpackage.json', '%2E%2E%2F%2E%2E%2Fpackage.json']) {
      const res = await fetch(`${server.origin}/playground/${name}`);
      expect(res.status).toBe(404);
      expect(((await res.json()) as ErrorBody).error.message).toMatch(/no file|not found|does not exist/i);
    }
  });

  it('says how to build it where the bundle is missing', async () => {
    const empty = await mkdtemp(path.join(os.tmpdir(), 'imagegen-no-playground-'));
    const app = Fastify();
    await app.register(errors, { metrics: new Metrics() });
    await app.register(playground, { dir: empty });
    try {
      const res = await app.inject({ url: '/' });
      expect(res.statusCode).toBe(503);
      expect(res.json()).toMatchObject({ error: { code: 'playground_not_built', message: expect.stringContaining('npm run build') } });
    } finally {
      await app.close();
      await rm(empty, { recursive: true });
    }
  });

  it('is off with PLAYGROUND=false: / is a 404 like any unknown URL', async () => {
    const off = await startTestServer({ config: { playground: false } });
    try {
      for (const page of ['/', '/playground/', '/playground/app.js']) expect((await fetch(`${off.origin}${page}`)).status).toBe(404);
    } finally {
      await off.close();
    }
  });
});
