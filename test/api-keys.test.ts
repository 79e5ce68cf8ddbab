import { createHash } from 'node:crypto';
import { mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import OpenAI, { toFile } from 'openai';
import { isSendableKey } from '../src/api/bearer.js';
import { loadConfig } from '../src/config.js';
import { KeyFileError, KeyRing, parseKeyFile, readKeyFile } from '../src/http/keys.js';
import { imageOwner } from '../src/store/image-owner.js';
import { startTestServer, TEST_KEY, type TestServer } from './helpers/api-server.js';
import { createBuiltPool } from './helpers/cli.js';
import { FakeEngine } from './helpers/engines.js';
import { capturedLogs } from './helpers/logs.js';
import { announcedForm } from './helpers/raw-http.js';

/** API_KEYS_FILE: its format, rotation without a restart, and keys kept out of the logs. */

describe('the key file format', () => {
  it('reads keys, labels, limits and comments', () => {
    const keys = parseKeyFile(
      ['# the team', '', 'alice:sk-alice-0001 images_per_minute=60 concurrent=2', '  sk-plain-0002  ', 'ci:sk-ci-0003 requests_per_minute=10'].join('\n'),
      'keys.txt',
    );
    expect(keys).toEqual([
      { label: 'alice', key: 'sk-alice-0001', owner: imageOwner('sk-alice-0001'), limits: { imagesPerMinute: 60, concurrent: 2 } },
      // Unlabelled: named by its digest, which stays when lines move (a line number would hand its limits to another key).
      { label: `sha256:${createHash('sha256').update('sk-plain-0002').digest('hex').slice(0, 12)}`, key: 'sk-plain-0002', owner: imageOwner('sk-plain-0002') },
      { label: 'ci', key: 'sk-ci-0003', owner: imageOwner('sk-ci-0003'), limits: { requestsPerMinute: 10 } },
    ]);
  });

  it('reads a file saved on Windows (CRLF, a byte-order mark), and refuses one saved as UTF-16 for how it is saved, not for keys it seemed to hold', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-keys-'));
    try {
      const file = path.join(dir, 'keys.txt');
      const text = '\uFEFFalice:sk-alice-0001 concurrent=2\r\nsk-plain-0002\r\n';
      await writeFile(file, text);
      expect((await readKeyFile(file)).map((key) => [key.label, key.key, key.limits])).toEqual([
        ['alice', 'sk-alice-0001', { concurrent: 2 }],
        [expect.stringMatching(/^sha256:/), 'sk-plain-0002', undefined],
      ]);
      // As Windows PowerShell 5's `>` and Out-File save it: read as UTF-8, it was 'the label must be ...' and 'the key must be printable ...' for every line.
      await writeFile(file, Buffer.from(text, 'utf16le'));
      await expect(readKeyFile(file)).rejects.toThrow(`API_KEYS_FILE ${file}: saved as UTF-16 (as Windows PowerShell 5 and Notepad's "Unicode" save text): save it as UTF-8`);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('names every bad line, never the key', () => {
    const text = ['a:sk-secret-1 speed=9', 'a:sk-secret-2', 'b:sk-secret-3 concurrent=0', 'c:sk secret', 'd:sk-secret-5 concurrent=1=2', 'e:sk-secret-6 concurrent=1 concurrent=3', 'sk-secret-7 sk-secret-8', 'f:sk-secret-9 c2VjcmV0LTEw= concurrent=2', 'g:sk-secret-11 concurrent=2 # team g=1', 'h:sk-secret-1 concurrent=1'].join('\n');
    const error = (() => {
      try {
        parseKeyFile(text, 'keys.txt');
      } catch (err) {
        return err as KeyFileError;
      }
    })();
    expect(error).toBeInstanceOf(KeyFileError);
    expect(error!.message).toMatch(/line 1: 'speed=9' is not a limit/);
    expect(error!.message).toMatch(/line 3: 'concurrent=0' is not a limit/);
    expect(error!.message).toMatch(/the label 'a' is used twice/);
    expect(error!.message).toMatch(/line 5: 'concurrent=1=2' is not a limit/);
    expect(error!.message).toMatch(/line 6: concurrent is given twice/);
    // One key under two labels (line 10 repeats line 1's): which line's limits it has would be a guess.
    expect(error!.message).toMatch(/a key is listed twice/);
    // Two keys on a line, or a key with a space in it: the word after the first is named by its place.
    expect(error!.message).toMatch(/line 4: word 2 \(not shown: it may be a key\) is not a limit/);
    expect(error!.message).toMatch(/line 7: word 2 \(not shown: it may be a key\) is not a limit/);
    expect(error!.message).toMatch(/line 8: word 2 \(not shown: it may be a key\) is not a limit/);
    // A comment after the limits is said to be one, once: its words are not limits to be named each.
    expect(error!.message).toMatch(/line 9: word 3 starts a comment, and a comment takes a line of its own \(a line starting with #\)/);
    expect(error!.message).not.toMatch(/line 9: .*not a limit/);
    expect(error!.message).not.toMatch(/secret|sk-|c2VjcmV0/);
  });
});

describe('what a key may be', () => {
  const sendable = ['sk-plain-0001', 'sk-0002!"#$%&\'()*+,-./;<=>?@[\\]^_`{|}~', 'sk-l\u00e4tin-0003', 'sk-0004:colon'];
  const unsendable = ['sk 0005', 'sk\t0006', 'sk\u00a00007', 'sk\u00850008', 'sk\u00000009', 'sk-\u20ac-0010'];
  let server: TestServer;
  beforeAll(async () => {
    // Every key in one server, set as the configuration would take them: what the rule lets through works.
    server = await startTestServer({ apiKeys: [...sendable, ...unsendable] });
  });
  afterAll(() => server.close());

  /** The status of a request sending `key`, or the client's error when it cannot even send it. */
  const sent = (key: string) =>
    fetch(`${server.baseURL}/models`, { headers: { authorization: `Bearer ${key}` } }).then(
      (res) => res.status,
      (err: Error) => err.name,
    );

  it('is one rule for API_KEYS, API_KEYS_FILE and the Authorization header: what is accepted can be sent, what cannot be sent is refused', async () => {
    for (const key of sendable) {
      expect(isSendableKey(key), key).toBe(true);
      expect(await sent(key), key).toBe(200);
      expect(loadConfig({}, { API_KEYS: key.replaceAll(',', '') }).apiKeys).toEqual([key.replaceAll(',', '')]);
      expect(parseKeyFile(`label:${key}`, 'keys.txt')).toEqual([{ label: 'label', key, owner: imageOwner(key) }]);
    }
    for (const key of unsendable) {
      expect(isSendableKey(key), JSON.stringify(key)).toBe(false);
      expect(await sent(key), JSON.stringify(key)).not.toBe(200);
      expect(() => loadConfig({}, { API_KEYS: key }), JSON.stringify(key)).toThrow(/without spaces or control characters/);
      if (!/\s/.test(key)) expect(() => parseKeyFile(`label:${key}`, 'keys.txt'), JSON.stringify(key)).toThrow(/line 1: the key must be printable characters without spaces/);
    }
  });

  it('reads the first colon of a line as the end of its label', () => {
    expect(parseKeyFile('sk:colon', 'keys.txt')).toEqual([{ label: 'sk', key: 'colon', owner: imageOwner('colon') }]);
  });
});

describe('rotating API_KEYS_FILE', () => {
  let server: TestServer;
  let keys: string;
  const logs = capturedLogs<Record<string, unknown>>();
  beforeAll(async () => {
    server = await startTestServer({ keysFile: '# keys\nold:sk-old-key-0123456789\n', logger: logs.logger });
    keys = server.keysFile!;
  });
  afterAll(() => server.close());

  const status = (key: string) => fetch(`${server.baseURL}/models`, { headers: { authorization: `Bearer ${key}` } }).then((res) => res.status);
  /** As editors and secret managers do: write elsewhere, rename over. */
  const replaceKeys = async (text: string) => {
    await writeFile(`${keys}.tmp`, text);
    await rename(`${keys}.tmp`, keys);
  };

  it('takes a new key and drops the old one without a restart', async () => {
    expect(await status('sk-old-key-0123456789')).toBe(200);
    expect(await status('sk-new-key-9876543210')).toBe(401);
    await replaceKeys('new:sk-new-key-9876543210 concurrent=1\n');
    await expect.poll(() => status('sk-new-key-9876543210'), { interval: 100 }).toBe(200);
    expect(await status('sk-old-key-0123456789')).toBe(401);
  });

  it('keeps the keys in use when the file turns bad, and says so', async () => {
    // Renamed over, as above: the bad text is all the server reads of it.
    await replaceKeys('new:sk-new-key-9876543210 speed=9\n');
    await expect.poll(() => logs.raw.some((line) => line.includes('keeping the 1 keys in use')), { interval: 100 }).toBe(true);
    expect(await status('sk-new-key-9876543210')).toBe(200);
  });

  it('names keys by label in the log, never by value', async () => {
    expect(logs.lines.some((line) => line.apiKey === 'new')).toBe(true);
    expect(logs.raw.join('')).not.toMatch(/sk-(old|new)-key/);
  });
});

describe('API_KEYS_FILE written in place', () => {
  const [first, second] = ['sk-first-key-0123456789', 'sk-second-key-0123456789'];

  /** A key ring on a file of `text`, whose changes must stay the same `settleMs` to be used. */
  async function ring(text: string, settleMs: number) {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'key-file-'));
    const file = path.join(dir, 'keys.txt');
    await writeFile(file, text);
    const logs = capturedLogs<{ msg: string; keys?: string[] }>();
    const keys = await KeyRing.open({ apiKeys: [], apiKeysFile: file, logger: logs.logger, settleMs });
    const reloads = () => logs.lines.filter((line) => line.msg === 'API keys reloaded').map((line) => line.keys);
    return { file, keys, reloads, close: () => (keys.close(), rm(dir, { recursive: true, force: true })) };
  }

  it('is used once it stays the same: read empty between its truncation and its write, its keys stay', async () => {
    const { file, keys, reloads, close } = await ring(`a:${first}\n`, 1500);
    try {
      // A shell's `>` or an editor saving in place: the file empty, and read so (as the poll would on
      // seeing it change), before the rest of the write lands.
      await writeFile(file, '');
      const reloaded = keys.reload();
      await new Promise((resolve) => setTimeout(resolve, 200));
      await writeFile(file, `a:${first}\nb:${second}\n`);
      expect(keys.find(first)?.label).toBe('a');
      await reloaded;
      expect([keys.find(first)?.label, keys.find(second)?.label]).toEqual(['a', 'b']);
      // Never a list of no keys, which refused every client until the next poll.
      expect(reloads()).not.toContainEqual([]);
      expect(reloads()).toContainEqual(['a', 'b']);
    } finally {
      await close();
    }
  });

  it('is no longer read once closed: a server closed in process (its tests, an embedding) keeps no poll of the file', async () => {
    const { file, keys, reloads, close } = await ring(`a:${first}\n`, 50);
    try {
      keys.close();
      await writeFile(file, `a:${first}\nb:${second}\n`);
      // Past the next poll (every second) and its settling.
      await new Promise((resolve) => setTimeout(resolve, 1500));
      expect(reloads()).toEqual([]);
      expect(keys.find(second)).toBeUndefined();
    } finally {
      await close();
    }
  });

  it('emptied for good, locks everyone out once it stays empty, as an empty key file says', async () => {
    const { file, keys, close } = await ring(`a:${first}\n`, 50);
    try {
      await writeFile(file, '');
      await keys.reload();
      expect(keys.find(first)).toBeUndefined();
    } finally {
      await close();
    }
  });
});

describe('an API_KEYS_FILE that holds no keys', () => {
  const noKeys = (file: string) => `API_KEYS_FILE ${file} holds no keys: every request that needs one gets 401 until a key is added to it (it is re-read as it changes)`;

  it("locks everyone out, and the server's log says so as it starts, and again when a re-read file holds none", async () => {
    const logs = capturedLogs<{ msg: string }>();
    const server = await startTestServer({ keysFile: '# keys go here, one a line\n', logger: logs.logger });
    try {
      const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'sk-anything-0123456789', maxRetries: 0 });
      await expect(client.models.list()).rejects.toMatchObject({ status: 401 });
      expect(logs.lines.map((line) => line.msg)).toContain(noKeys(server.keysFile!));
      await writeFile(`${server.keysFile!}.tmp`, 'a:sk-anything-0123456789\n');
      await rename(`${server.keysFile!}.tmp`, server.keysFile!);
      await expect.poll(() => client.models.list().then(() => true, () => false), { interval: 100 }).toBe(true);
      await writeFile(`${server.keysFile!}.tmp`, '');
      await rename(`${server.keysFile!}.tmp`, server.keysFile!);
      await expect.poll(() => logs.lines.filter((line) => line.msg === noKeys(server.keysFile!)).length, { interval: 100 }).toBe(2);
    } finally {
      await server.close();
    }
  });
});

describe('credentials in logs', () => {
  it('logs neither a key in the query string nor one in a header, and /ready once per change', async () => {
    const logs = capturedLogs<Record<string, unknown>>();
    const engine = createBuiltPool({ workers: 1, queueMax: 1, executionProvider: 'cpu', threadsPerWorker: 1 });
    // Its worker held stopped: the server stays starting, however often /ready is polled, until it goes on.
    const { pid } = engine.workers()[0];
    process.kill(pid!, 'SIGSTOP');
    const server = await startTestServer({ logger: logs.logger, engine });
    try {
      const secret = 'sk-leaked-in-query-0123456789';
      await fetch(`${server.baseURL}/models?api_key=${secret}`);
      await fetch(`${server.origin}/nothing?${secret}`, { headers: { authorization: `Bearer ${secret}`, 'x-api-key': secret } });
      await fetch(`${server.baseURL}/images/generations?key=${secret}`, { method: 'POST', body: '{', headers: { 'content-type': 'application/json', authorization: `Bearer ${secret}` } });
      const ready = () => fetch(`${server.origin}/ready?token=${secret}`).then((res) => res.status);
      for (let i = 0; i < 5; i++) expect(await ready()).toBe(503);
      process.kill(pid!, 'SIGCONT');
      await expect.poll(ready, { timeout: 30_000, interval: 20 }).toBe(200);
      for (let i = 0; i < 5; i++) expect(await ready()).toBe(200);
      const raw = logs.raw.join('');
      expect(raw).toContain('[redacted]');
      expect(raw).not.toContain(secret);
      expect(raw).not.toContain('leaked');
      // One line per change of readiness, however often it is polled.
      expect(logs.lines.filter((line) => /^(not )?ready/.test(String(line.msg))).map((line) => line.msg)).toEqual([
        'not ready: /ready answers 503: The server is starting and cannot generate yet: 0 of 1 workers are ready.',
        'ready: /ready answers 200',
      ]);
      expect(raw).not.toContain('"stack"');
    } finally {
      await server.close();
    }
  });

  it("logs an unknown field's name cut short: it is the client's own text, as long as the body may be", async () => {
    const logs = capturedLogs<{ msg: string; param?: string; code?: string }>();
    const server = await startTestServer({ logger: logs.logger });
    try {
      const name = `pasted-${'x'.repeat(200_000)}`;
      const res = await fetch(`${server.baseURL}/images/generations`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${TEST_KEY}` },
        body: JSON.stringify({ prompt: 'a red circle', [name]: 1 }),
      });
      expect(res.status).toBe(400);
      expect(((await res.json()) as { error: { code: string } }).error.code).toBe('unknown_parameter');
      const line = logs.lines.find((l) => l.msg === 'request completed' && l.code === 'unknown_parameter');
      // Which field it was still shows, cut as the answer's param is (ApiError.unknownParameter); not 200 KB of it on every such line.
      expect(line?.param).toBe(`pasted-${'x'.repeat(33)}...`);
      expect(logs.raw.join('').length).toBeLessThan(20_000);
    } finally {
      await server.close();
    }
  });
});

describe("a key file's per-minute limits", () => {
  let server: TestServer;
  beforeAll(async () => {
    server = await startTestServer({ keysFile: 'slow:sk-slow-key-0123456789 requests_per_minute=1\nfree:sk-free-key-0123456789 concurrent=2\n' });
  });
  afterAll(() => server.close());

  const client = (apiKey: string) => new OpenAI({ baseURL: server.baseURL, apiKey, maxRetries: 0 });
  const generate = (apiKey: string) => client(apiKey).images.generate({ model: 'stub', prompt: 'a red circle', response_format: 'b64_json' });

  it('answers a key over its requests_per_minute with 429 and Retry-After, other keys unaffected', async () => {
    const asked = performance.now();
    const { response } = await generate('sk-slow-key-0123456789').withResponse();
    // OpenAI's rate-limit headers, on the answer.
    expect(['limit', 'remaining', 'reset'].map((what) => response.headers.get(`x-ratelimit-${what}-requests`))).toEqual(['1', '0', '1m0s']);
    const err = await generate('sk-slow-key-0123456789').catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.RateLimitError);
    const limited = err as InstanceType<typeof OpenAI.RateLimitError>;
    expect(limited.error).toMatchObject({ type: 'requests', code: 'rate_limit_exceeded', message: expect.stringMatching(/API key 'slow': at most 1 request a minute/) });
    // The minute runs from the first request's admission: at least 60 s less what both requests took is
    // left of it. (The first is the file's first generation, which waits for the worker to start: "over
    // 50 s" held that start and the generation to 10 s, however loaded the machine.)
    const took = (performance.now() - asked) / 1000;
    expect(Number(limited.headers.get('retry-after'))).toBeGreaterThanOrEqual(Math.floor(60 - took));
    expect(limited.headers.get('x-ratelimit-remaining-requests')).toBe('0');
    for (let i = 0; i < 3; i++) await generate('sk-free-key-0123456789');
  });

  it('counts only valid requests, and refuses one over the limit before any work (an edit before reading or decoding its picture)', async () => {
    const limited = await startTestServer({ keysFile: 'edits:sk-edits-key-0123456789 requests_per_minute=1\n' });
    const as = new OpenAI({ baseURL: limited.baseURL, apiKey: 'sk-edits-key-0123456789', maxRetries: 0 });
    const fails = (call: Promise<unknown>) => call.catch((e: unknown) => e);
    try {
      // Requests that cannot run use none of the minute's one request.
      expect(await fails(as.images.generate({ model: 'no-such-model', prompt: 'x' }))).toMatchObject({ status: 400, param: 'model' });
      expect(await fails(as.images.generate({ model: 'stub', prompt: 'x', size: '999x999' as '1024x1024' }))).toMatchObject({ status: 400, param: 'size' });
      expect((await as.images.generate({ model: 'stub', prompt: 'x', response_format: 'b64_json' })).data).toHaveLength(1);
      // Not a picture at all: only a request the limit admits would be decoded, and get the 400 that says so.
      const edit = await fails(as.images.edit({ model: 'stub', prompt: 'x', image: await toFile(Buffer.from('not a picture'), 'in.png') }));
      expect(edit).toMatchObject({ status: 429, code: 'rate_limit_exceeded' });
      // Refused before its upload is read: a form announced as 20 MB of which nothing comes still gets its 429.
      const stalled = await announcedForm(`${limited.baseURL}/images/edits`, 'Bearer sk-edits-key-0123456789', 20e6);
      expect(stalled.status).toBe(429);
      expect(JSON.parse(stalled.body)).toMatchObject({ error: { code: 'rate_limit_exceeded' } });
    } finally {
      await limited.close();
    }
  });

  it("says on each error answer's 'request completed' line its code and param, and which limit a 429 met: the status alone tells no 400 and no 429 from another", async () => {
    const logs = capturedLogs<{ msg: string; reqId?: string; res?: { statusCode: number }; code?: string | null; param?: string; limit?: string }>();
    // A worker and no room to wait: a second request while one runs finds the queue full.
    const engine = new FakeEngine(1, 0);
    const limited = await startTestServer({ engine, logger: logs.logger, keysFile: 'slow:sk-slow-key-0123456789 requests_per_minute=1\nfree:sk-free-key-0123456789\n' });
    const as = (apiKey: string) => new OpenAI({ baseURL: limited.baseURL, apiKey, maxRetries: 0 });
    const ask = (apiKey: string, id: string, params: Record<string, unknown> = {}) =>
      as(apiKey)
        .images.generate({ model: 'stub', prompt: 'a red circle', response_format: 'b64_json', ...params }, { headers: { 'x-request-id': id } })
        .then(() => 200, (err: { status: number }) => err.status);
    const completed = (id: string) => logs.lines.find((line) => line.reqId === id && line.msg === 'request completed');
    try {
      expect(await ask('sk-free-key-0123456789', 'bad-size', { size: '999x999' })).toBe(400);
      expect(await ask('sk-slow-key-0123456789', 'first')).toBe(200);
      expect(await ask('sk-slow-key-0123456789', 'over-minute')).toBe(429);
      engine.hold();
      const running = ask('sk-free-key-0123456789', 'running');
      await expect.poll(() => engine.load().running).toBe(1);
      expect(await ask('sk-free-key-0123456789', 'queue-full')).toBe(429);
      engine.release();
      expect(await running).toBe(200);
      await expect.poll(() => completed('running')).toBeDefined();
      expect(completed('bad-size')).toMatchObject({ res: { statusCode: 400 }, code: 'invalid_value', param: 'size' });
      expect(completed('over-minute')).toMatchObject({ res: { statusCode: 429 }, code: 'rate_limit_exceeded', limit: 'requests_per_minute' });
      expect(completed('queue-full')).toMatchObject({ res: { statusCode: 429 }, code: 'rate_limit_exceeded', limit: 'QUEUE_MAX' });
      // An answer that is no error says no code.
      expect(completed('first')).not.toHaveProperty('code');
    } finally {
      engine.release();
      await limited.close();
    }
  });

  it("queues each request as its key's label, with the key's concurrent limit, so keys are served fairly", () => {
    // The queue's fairness and its per-client limits are tested on the real engine in ops-hardening and
    // queue-fairness; here, that HTTP hands them the key.
    expect(server.engine.tickets).toEqual([
      { client: 'slow', limits: undefined },
      ...Array.from({ length: 3 }, () => ({ client: 'free', limits: { maxConcurrent: 2 } })),
    ]);
  });
});
