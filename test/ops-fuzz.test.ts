import http from 'node:http';
import net from 'node:net';
import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MAX_PARAM_LENGTH } from '../src/http/app.js';
import { auth, generate, metric, MODEL, OPS_KEY, scrape, startOpsServer, untilReady, type OpsServer } from './helpers/ops-server.js';
import type { ErrorBody } from '../src/api/wire.js';

/**
 * Thousands of malformed requests against the real server, over keep-alive connections in parallel:
 * every answer must be a 4xx in OpenAI's error shape, none may run the engine, and the server must
 * still generate afterwards. The cases are drawn from a seeded generator, so a failure reproduces.
 */

const REQUESTS = 3000;
const PARALLEL = 16;

interface Case {
  method: string;
  path: string;
  headers: Record<string, string | string[]>;
  body?: string | Buffer;
}

/** Mulberry32: small, seeded, good enough to pick cases. */
function random(seed: number) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const ODD_TEXT = [
  '\ud800', // lone high surrogate
  'a\udc00b', // lone low surrogate
  '\u202eevil\u202c', // right-to-left override
  'zero\u200bwidth\u200d\ufeff',
  '🧨💥👩‍👩‍👧‍👦🏳️‍🌈',
  'e\u0301\u0301\u0301\u0301', // stacked combining marks
  'مرحبا بالعالم',
  '\u0000nul',
  '../../etc/passwd',
  '%00%2e%2e',
];

/** For each request field, values of a wrong type or out of range (null is "omitted", so never used). */
const WRONG: Record<string, unknown[]> = {
  model: [1, true, [], {}, '', 'no-such-model', ...ODD_TEXT],
  prompt: [1, false, ['a'], { text: 'a' }, '', 'x'.repeat(32001), ODD_TEXT.join('').repeat(4000)],
  n: ['2', 0, -1, 11, 1.5, 1e308, true, [1], {}],
  size: [512, true, [], {}, '1024', '512x', 'x512', '0x0', '99999x99999', '-512x-512', ...ODD_TEXT],
  quality: [1, true, 'ultra', ...ODD_TEXT],
  style: [1, [], 'weird', ...ODD_TEXT],
  response_format: [1, {}, 'gif', ...ODD_TEXT],
  output_format: [1, 'bmp', 'PNG', ...ODD_TEXT],
  output_compression: ['50', -1, 101, 2.5, true],
  background: ['transparent', 1, 'clear'],
  moderation: ['high', 0],
  stream: ['false', 1, {}],
  stream_progress: ['true', 1],
  partial_images: [4, -1, '1', 0.5],
  seed: [-2, 2 ** 32, 1.5, '7', [], {}],
  steps: [0, 151, 2.5, '4', true],
  guidance_scale: [-1, 31, '7', [], {}],
  negative_prompt: [1, [], {}, 'x'.repeat(32001)],
  scheduler: ['nope', 1, ...ODD_TEXT],
  user: [1, [], {}],
};

const BAD_JSON = [
  '',
  '{',
  '{"model":}',
  '{"model":"shapes",}',
  "{'model':'shapes'}",
  '{"model": NaN}',
  'null',
  '[]',
  '"a string"',
  '42',
  'true',
  '{"model":"shapes","prompt":"x"}}',
  '\ufeff{"model":"shapes"}',
  '[' .repeat(50_000) + ']'.repeat(50_000),
  `{"a":${'['.repeat(5_000)}{"__proto__":{"x":1}}${']'.repeat(5_000)}}`,
  '{"__proto__":{"admin":true},"model":"shapes","prompt":"x"}',
  '{"constructor":{"prototype":{"admin":true}},"model":"shapes","prompt":"x"}',
];

const IMAGE_PATHS = [
  '/v1/images/files/../../etc/passwd',
  '/v1/images/files/..%2f..%2fetc%2fpasswd',
  '/v1/images/files/%2e%2e%2f%2e%2e%2fpackage.json',
  '/v1/images/files/%252e%252e%252fpackage.json',
  '/v1/images/files/..%5c..%5cwindows%5cwin.ini',
  '/v1/images/files/%00.png',
  '/v1/images/files/0123456789abcdef0123456789abcdef.png%00.txt',
  '/v1/images/files/0123456789abcdef0123456789abcdef.png',
  '/v1/images/files/.%2e/.%2e/package.json',
  '/v1/images/files//etc/passwd',
  '/v1/images/files/%c0%ae%c0%ae%2fpackage.json',
  '/v1/images/files/',
  '/v1/images/../../../../etc/passwd',
  `/v1/images/files/${'a'.repeat(MAX_PARAM_LENGTH + 1)}.png`,
  '/v1/images/files/%E0%A4%A.png',
];

const VALID = { model: MODEL, prompt: 'a red circle', steps: 1 };

function drawCase(next: () => number): Case {
  const pick = <T>(items: readonly T[]): T => items[Math.floor(next() * items.length)];
  const json = (body: unknown, headers: Record<string, string | string[]> = {}): Case => ({
    method: 'POST',
    path: '/v1/images/generations',
    headers: { ...auth, 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  switch (pick(['field', 'field', 'field', 'fields', 'json', 'headers', 'path', 'method'] as const)) {
    case 'field': {
      const field = pick(Object.keys(WRONG));
      return json({ ...VALID, [field]: pick(WRONG[field]) });
    }
    case 'fields': {
      const body: Record<string, unknown> = { ...VALID };
      const fields = Object.keys(WRONG).filter(() => next() < 0.3);
      for (const field of fields.length ? fields : ['n']) body[field] = pick(WRONG[field]);
      if (next() < 0.3) body[pick(ODD_TEXT)] = 1; // an unknown parameter
      return json(body);
    }
    case 'json':
      return { method: 'POST', path: '/v1/images/generations', headers: { ...auth, 'content-type': 'application/json' }, body: pick(BAD_JSON) };
    case 'headers':
      return pick<() => Case>([
        () => json(VALID, { 'content-type': pick(['text/plain', 'application/xml', 'multipart/form-data; boundary=x', 'application/x-www-form-urlencoded', 'application/jsonx']) }),
        () => ({ ...json(VALID), body: Buffer.from(JSON.stringify(VALID), 'utf16le'), headers: { ...auth, 'content-type': 'application/json; charset=utf-16' } }),
        () => json({ ...VALID, n: 0 }, { 'content-type': 'application/json; charset=latin1' }),
        () => json(VALID, { authorization: ['Bearer sk-wrong-key-000000', `Bearer ${OPS_KEY}`] }),
        () => json({ ...VALID, n: 0 }, { authorization: [`Bearer ${OPS_KEY}`, 'Bearer sk-wrong-key-000000'] }),
        () => json(VALID, { authorization: pick(['', 'Bearer', 'Basic dXNlcjpwYXNz', `bearer  ${OPS_KEY}x`, 'Bearer ' + 'k'.repeat(8000)]) }),
        () => json({ ...VALID, n: 0 }, { 'x-request-id': pick(['', 'x'.repeat(500), 'id with spaces', 'é']) }),
        () => json(VALID, { 'x-padding': 'p'.repeat(20_000) }),
        () => ({ ...json(VALID), headers: { ...auth } }),
        () => ({ ...json({ ...VALID, prompt: 'x'.repeat(1_100_000) }) }),
        // Issue #13: compressed bodies (a bomb, a lie, an unknown coding), forged hosts, odd expectations.
        () => ({ ...json(VALID), body: gzipSync(Buffer.alloc(8 * 1024 ** 2, 32)), headers: { ...auth, 'content-type': 'application/json', 'content-encoding': 'gzip' } }),
        () => ({ ...json(VALID), headers: { ...auth, 'content-type': 'application/json', 'content-encoding': pick(['gzip', 'br', 'deflate', 'zstd', 'gzip, gzip']) } }),
        () => json({ ...VALID, n: 0 }, { host: pick(['127.0.0.1:1@evil.example', '<b>x</b>', 'a/b', 'evil.example:99999']) }),
        () => json({ ...VALID, n: 0 }, { 'x-forwarded-host': 'evil.example', 'x-forwarded-proto': 'javascript' }),
        () => json(VALID, { expect: pick(['tea', '200-ok']) }),
      ])();
    case 'path':
      return { method: pick(['GET', 'HEAD']), path: pick(IMAGE_PATHS), headers: next() < 0.5 ? { ...auth } : {} };
    case 'method':
      return { method: pick(['PUT', 'DELETE', 'PATCH', 'OPTIONS', 'BREW']), path: pick(['/v1/images/generations', '/v1/models', '/health', '/v1/nothing']), headers: { ...auth } };
  }
}

function send(agent: http.Agent, origin: URL, c: Case): Promise<{ status: number; contentType: string; body: string; case: Case }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ agent, host: origin.hostname, port: origin.port, method: c.method, path: c.path, headers: c.headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('end', () => resolve({ status: res.statusCode!, contentType: res.headers['content-type'] ?? '', body: Buffer.concat(chunks).toString(), case: c }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(c.body);
  });
}

let ops: OpsServer;
beforeAll(async () => {
  ops = await startOpsServer();
  await untilReady(ops.server.url);
});
afterAll(() => ops?.close());

function expectOpenAiError(answer: Awaited<ReturnType<typeof send>>) {
  const context = `${answer.case.method} ${answer.case.path.slice(0, 80)} ${String(answer.case.body ?? '').slice(0, 120)} -> ${answer.status} ${answer.body.slice(0, 200)}`;
  expect(answer.status, context).toBeGreaterThanOrEqual(400);
  expect(answer.status, context).toBeLessThan(500);
  if (answer.case.method === 'HEAD') return; // no body by definition
  expect(answer.contentType, context).toMatch(/^application\/json/);
  const { error } = JSON.parse(answer.body) as ErrorBody;
  expect(Object.keys(error).sort(), context).toEqual(['code', 'message', 'param', 'type']);
  expect([typeof error.message, typeof error.type], context).toEqual(['string', 'string']);
  expect((error.message as string).length, context).toBeGreaterThan(0);
  expect([null, 'string'], context).toContain(error.param === null ? null : typeof error.param);
  expect([null, 'string'], context).toContain(error.code === null ? null : typeof error.code);
}

describe('fuzzing the HTTP API', () => {
  it(`answers ${REQUESTS} malformed requests with 4xx OpenAI errors only, never running the engine`, async () => {
    const agent = new http.Agent({ keepAlive: true, maxSockets: PARALLEL });
    const origin = new URL(ops.server.url);
    const next = random(20_261_121);
    const cases = Array.from({ length: REQUESTS }, () => drawCase(next));
    const statuses = new Map<number, number>();
    try {
      await Promise.all(
        Array.from({ length: PARALLEL }, async (_, lane) => {
          for (let i = lane; i < cases.length; i += PARALLEL) {
            const answer = await send(agent, origin, cases[i]);
            statuses.set(answer.status, (statuses.get(answer.status) ?? 0) + 1);
            expectOpenAiError(answer);
          }
        }),
      );
    } finally {
      agent.destroy();
    }
    // The mix reached every kind of refusal.
    expect([...statuses.keys()].sort()).toEqual(expect.arrayContaining([400, 401, 404, 405, 413, 414, 415, 417, 431]));
    expect(metric(await scrape(ops.server.url), 'imagegen_queue_wait_seconds_count')).toBe(0);
  });

  it('answers what Node cannot parse as HTTP in OpenAI\'s shape too', async () => {
    const raw = (request: string) =>
      new Promise<string>((resolve) => {
        let answer = '';
        const socket = net.connect(Number(new URL(ops.server.url).port), '127.0.0.1');
        socket.on('data', (chunk) => (answer += chunk.toString()));
        socket.on('close', () => resolve(answer));
        socket.write(request);
      });
    const requests = [
      'GET /v1/\0models HTTP/1.1\r\nHost: a\r\n\r\n',
      'HELLO\r\n\r\n',
      'GET / HTTP/9.9\r\n\r\n',
      `GET /health HTTP/1.1\r\nHost: a\r\nX-Bad: a\u0001b\r\n\r\n`,
      'POST /v1/images/generations HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n',
    ];
    for (const request of requests) {
      const [head, body] = (await raw(request)).split('\r\n\r\n');
      expect([request, head.split('\r\n')[0]]).toEqual([request, 'HTTP/1.1 400 Bad Request']);
      expect(head).toMatch(/\r\nx-request-id: req_[0-9a-f]{32}\r\n/);
      expect(JSON.parse(body).error).toMatchObject({ type: 'invalid_request_error', code: 'malformed_request', param: null });
    }
  });

  it('still generates afterwards, also from prompts of odd unicode', async () => {
    for (const prompt of ['a red circle', ...ODD_TEXT]) {
      const answer = await generate(ops.baseURL, { prompt, steps: 1 });
      expect([prompt, answer.status]).toEqual([prompt, 200]);
      expect(answer.body.data).toHaveLength(1);
    }
  });
});
