import net from 'node:net';
import { cp, mkdir, readdir, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import OpenAI from 'openai';
import type { ImageGenerateParamsNonStreaming } from 'openai/resources/images';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { apiError } from './helpers/failures.js';
import { MAX_SEED } from '../src/runtime/random.js';
import { MAX_PROMPT_LENGTH, type ModelObject } from '../src/api/wire.js';
import { schedulersFor } from '../src/schedulers/index.js';
import { startTestServer, STUB_SIZES, TEST_KEY, type TestServer } from './helpers/api-server.js';
import { FakeEngine } from './helpers/engines.js';
import { capturedLogs } from './helpers/logs.js';
import { readImageFile } from './helpers/picture.js';
import { parseResponse, rawRequest } from './helpers/raw-http.js';

/**
 * The OpenAI-compatible API through the official SDK against the real HTTP app, store, registry and
 * engine (the demo model at small sizes): what an unchanged OpenAI app sees, error for error.
 */

let server: TestServer;
beforeAll(async () => {
  server = await startTestServer();
});
afterAll(() => server.close());

/** Our extension fields are not in the SDK's types; apps add them to the params object. */
const generate = (params: Record<string, unknown>, client = server.client) =>
  client.images.generate({ model: 'stub', prompt: 'a red circle', ...params } as unknown as ImageGenerateParamsNonStreaming);


async function decode(data: Uint8Array | ArrayBuffer) {
  return sharp(Buffer.from(data as ArrayBuffer)).metadata();
}

describe('POST /v1/images/generations', () => {
  it('returns n inline images of the asked size, each with its own seed', async () => {
    const res = await generate({ response_format: 'b64_json', n: 3, size: '128x64' });
    expect(res.created).toBeGreaterThan(Date.now() / 1000 - 60);
    expect(res.created).toBeLessThanOrEqual(Math.ceil(Date.now() / 1000));
    expect(res.data).toHaveLength(3);
    for (const image of res.data!) {
      expect(Object.keys(image).sort()).toEqual(['b64_json', 'seed']);
      const meta = await decode(Buffer.from(image.b64_json!, 'base64'));
      expect([meta.format, meta.width, meta.height]).toEqual(['png', 128, 64]);
      // The prompt's picture: the demo model draws it in the colour asked (its shape is rough this small).
      expect((await readImageFile(Buffer.from(image.b64_json!, 'base64'))).reading.colour).toBe('red');
    }
    const seeds = res.data!.map((d) => (d as { seed: number }).seed);
    expect(seeds).toEqual([seeds[0], seeds[0] + 1, seeds[0] + 2].map((s) => s % (MAX_SEED + 1)));
    expect(new Set(res.data!.map((d) => d.b64_json)).size).toBe(3);
  });

  it('takes seed -1 as a random seed, as A1111 and ComfyUI do', async () => {
    const drawn = async () => ((await generate({ seed: -1, response_format: 'b64_json' })).data![0] as { seed: number }).seed;
    const [a, b] = [await drawn(), await drawn()];
    for (const seed of [a, b]) expect(seed).toBeGreaterThanOrEqual(0);
    expect(a).not.toBe(b);
  });

  it('returns absolute URLs by default that load without a key and carry their remaining lifetime', async () => {
    const res = await generate({ n: 2 });
    expect(res.data).toHaveLength(2);
    for (const image of res.data!) {
      expect(Object.keys(image).sort()).toEqual(['seed', 'url']);
      expect(image.url).toMatch(new RegExp(`^${server.origin}/v1/images/files/[0-9a-f]{32}\\.png$`));
      const file = await fetch(image.url!);
      expect(file.status).toBe(200);
      expect(file.headers.get('content-type')).toBe('image/png');
      const maxAge = Number(/max-age=(\d+)/.exec(file.headers.get('cache-control') ?? '')?.[1]);
      expect(maxAge).toBeGreaterThan(3500);
      expect(maxAge).toBeLessThanOrEqual(3600);
      const meta = await decode(await file.arrayBuffer());
      expect([meta.width, meta.height]).toEqual([64, 64]); // the model's default size
    }
  });

  it('reproduces images from a seed, image i using seed + i, wrapping at the largest seed', async () => {
    const res = await generate({ response_format: 'b64_json', n: 2, seed: MAX_SEED });
    expect(res.data!.map((d) => (d as { seed: number }).seed)).toEqual([MAX_SEED, 0]);
    const again = await generate({ response_format: 'b64_json', seed: 0 });
    expect(again.data![0].b64_json).toBe(res.data![1].b64_json);
  });

  it('maps quality and style to the model preset and passes extension fields to the engine', async () => {
    const before = server.engine.batches.length;
    await generate({ quality: 'hd', style: 'natural' });
    await generate({ steps: 7, guidance_scale: 2.5, negative_prompt: 'blurry', scheduler: 'euler', output_format: 'webp', output_compression: 60 });
    const [hd, custom] = server.engine.batches.slice(before);
    // The demo model is an SD-Turbo export: no guidance; its imagegen.json asks 8 steps for hd.
    expect({ steps: hd.steps, guidance: hd.guidanceScale, output: hd.items[0].output }).toEqual({ steps: 8, guidance: 0, output: { format: 'png' } });
    expect(custom).toMatchObject({ steps: 7, guidanceScale: 2.5, scheduler: 'euler' });
    expect(custom.items[0]).toMatchObject({ prompt: 'a red circle', negativePrompt: 'blurry', output: { format: 'webp', compression: 60 } });
  });

  it('serves jpeg and webp with their content types', async () => {
    for (const [format, type] of [['jpeg', 'image/jpeg'], ['webp', 'image/webp']]) {
      const res = await generate({ output_format: format, output_compression: 80 });
      expect(res.data![0].url).toMatch(format === 'jpeg' ? /\.jpg$/ : /\.webp$/);
      const file = await fetch(res.data![0].url!);
      expect(file.headers.get('content-type')).toBe(type);
      expect((await decode(await file.arrayBuffer())).format).toBe(format);
    }
  });

  it('takes a PNG with output_compression 100 (no compression, which a lossless format always has), as a client sending the field whatever the format does', async () => {
    const res = await generate({ output_format: 'png', output_compression: 100 });
    expect((await decode(await (await fetch(res.data![0].url!)).arrayBuffer())).format).toBe('png');
  });

  it('accepts the OpenAI names of models and fields it does not use, and null as omitted', async () => {
    const res = await generate({
      model: 'dall-e-3',
      user: 'user-1234',
      moderation: 'low',
      background: 'opaque',
      quality: 'high',
      stream: false,
      size: null,
      n: null,
      style: null,
    });
    expect(res.data).toHaveLength(1);
  });

  it('answers with application/json and the request id headers', async () => {
    const { data, response, request_id } = await server.client.images
      .generate({ model: 'stub', prompt: 'x', response_format: 'b64_json' })
      .withResponse();
    expect(data.data).toHaveLength(1);
    expect(response.headers.get('content-type')).toMatch(/^application\/json/);
    expect(request_id).toMatch(/^req_[0-9a-f]{32}$/);
    expect(Number(response.headers.get('openai-processing-ms'))).toBeGreaterThanOrEqual(0);
    expect(response.headers.get('openai-version')).toBe('2020-10-01');
  });
});

describe('request validation', () => {
  const cases: Array<[string, Record<string, unknown>, string | null, string, string?]> = [
    ['empty model', { model: '' }, 'model', 'empty_string'],
    // Longer than a folder name can be; it would go into every log line of the request.
    ['model too long', { model: 'm'.repeat(256) }, 'model', 'string_above_max_length'],
    ['size too long', { size: `${'1'.repeat(40)}x512` }, 'size', 'string_above_max_length'],
    ['missing prompt', { prompt: undefined }, 'prompt', 'missing_required_parameter', "Missing required parameter: 'prompt'."],
    ['null prompt', { prompt: null }, 'prompt', 'missing_required_parameter'],
    ['empty prompt', { prompt: '' }, 'prompt', 'empty_string'],
    ['prompt too long', { prompt: 'x'.repeat(MAX_PROMPT_LENGTH + 1) }, 'prompt', 'string_above_max_length'],
    ['prompt not a string', { prompt: 42 }, 'prompt', 'invalid_type', "Invalid type for 'prompt': expected a string, but got an integer instead."],
    ['n above 10', { n: 11 }, 'n', 'integer_above_max_value', "Invalid 'n': integer above maximum value. Expected a value <= 10, but got 11 instead."],
    ['n below 1', { n: 0 }, 'n', 'integer_below_min_value', "Invalid 'n': integer below minimum value. Expected a value >= 1, but got 0 instead."],
    ['n as a string', { n: '2' }, 'n', 'invalid_type', "Invalid type for 'n': expected an integer, but got a string instead."],
    ['n not whole', { n: 1.5 }, 'n', 'invalid_type', "Invalid type for 'n': expected an integer, but got a decimal number instead."],
    ['unsupported size', { size: '1536x1024' }, 'size', 'invalid_value', `Invalid value: '1536x1024'. Supported values are: ${"'64x64', '128x64', and '512x512'"}. The server serves another size (both sides multiples of 64) once it is in 'sizes' in the model's imagegen.json.`],
    ['malformed size', { size: 'big' }, 'size', 'invalid_value'],
    ['unknown response_format', { response_format: 'png' }, 'response_format', 'invalid_value', "Invalid value: 'png'. Supported values are: 'url' and 'b64_json'."],
    // A list holding a valid value, or a number, is no value of the list: it read "Invalid value: 'hd'" beside a list that has 'hd'.
    ['response_format in a list', { response_format: ['b64_json'] }, 'response_format', 'invalid_type', "Invalid type for 'response_format': expected one of 'url' or 'b64_json', but got an array instead."],
    ['quality as a number', { quality: 1 }, 'quality', 'invalid_type'],
    ['unknown quality', { quality: 'ultra' }, 'quality', 'invalid_value'],
    ['unknown style', { style: 'gothic' }, 'style', 'invalid_value'],
    ['unknown field', { foo: 1 }, 'foo', 'unknown_parameter', "Unknown parameter: 'foo'."],
    // A key as long as the body allows is quoted as a form's text is, not echoed whole in message and param.
    ['long unknown field', { ['🦊'.repeat(45)]: 1 }, `${'🦊'.repeat(40)}...`, 'unknown_parameter', `Unknown parameter: '${'🦊'.repeat(40)}...'.`],
    ['transparent background', { background: 'transparent' }, 'background', 'unsupported_value'],
    ['compression of a PNG', { output_compression: 50 }, 'output_compression', 'unsupported_value'],
    ['compression above 100', { output_format: 'jpeg', output_compression: 101 }, 'output_compression', 'integer_above_max_value'],
    ['unknown output_format', { output_format: 'gif' }, 'output_format', 'invalid_value'],
    ['streamed urls', { stream: true, response_format: 'url' }, 'response_format', 'unsupported_value'],
    ['stream_progress without stream', { stream_progress: true }, 'stream_progress', 'unsupported_value'],
    ['negative seed', { seed: -2 }, 'seed', 'integer_below_min_value'],
    ['seed above 32 bits', { seed: MAX_SEED + 1 }, 'seed', 'integer_above_max_value'],
    ['zero steps', { steps: 0 }, 'steps', 'integer_below_min_value'],
    ['guidance too high', { guidance_scale: 31 }, 'guidance_scale', 'decimal_above_max_value'],
    ['unknown scheduler', { scheduler: 'nope' }, 'scheduler', 'invalid_value'],
    ['scheduler of another model kind', { scheduler: schedulersFor('flow')[0] }, 'scheduler', 'invalid_value'],
  ];

  it.each(cases)('%s -> 400 BadRequestError', async (_, params, param, code, message) => {
    const err = await apiError(generate(params));
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect({ status: err.status, type: err.type, param: err.param, code: err.code }).toEqual({ status: 400, type: 'invalid_request_error', param, code });
    if (message) expect((err.error as { message: string }).message).toBe(message);
    expect(err.requestID).toMatch(/^req_/);
  });

  it('reports an unknown parameter before other problems', async () => {
    const err = await apiError(generate({ prompt: undefined, sizes: '64x64' }));
    expect([err.param, err.code]).toEqual(['sizes', 'unknown_parameter']);
  });

  it('rejects an unknown model as OpenAI does, naming the installed ones', async () => {
    const err = await apiError(generate({ model: 'dall-e-4' }));
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect({ type: err.type, param: err.param, code: err.code }).toEqual({ type: 'image_generation_user_error', param: 'model', code: 'invalid_value' });
    expect(err.message).toContain("The model 'dall-e-4' does not exist. Available models: 'stub' and 'dall-e-3'.");
  });

  it('says why an installed model cannot be used, where a request or /v1/models names it, with no server path', async () => {
    // A model folder with nothing but a broken preset file: the scan skips it, and says why.
    await mkdir(path.join(server.modelsDir, 'broken'));
    await writeFile(path.join(server.modelsDir, 'broken', 'model_index.json'), '{');
    // The server's to repair, not the request's: a 500 not to be retried, as for a model found broken as it loads (model-failures.test.ts).
    const err = await apiError(generate({ model: 'broken' }));
    expect({ status: err.status, type: err.type, param: err.param, code: err.code }).toEqual({ status: 500, type: 'server_error', param: null, code: 'model_unusable' });
    expect(err.headers?.get('x-should-retry')).toBe('false');
    const { message } = err.error as { message: string };
    expect(message).toMatch(/^The model 'broken' is installed but cannot be used \(.+\); the server's operator can repair it\. Available models: 'stub'/);
    expect(message).not.toContain(server.modelsDir);
    const retrieved = await server.client.models.retrieve('broken').catch((e: unknown) => e as InstanceType<typeof OpenAI.APIError>);
    expect(retrieved).toMatchObject({ status: 404, code: 'model_not_found' });
    expect((retrieved as InstanceType<typeof OpenAI.APIError>).message).toContain(message.slice(0, message.indexOf(';')));
    await rm(path.join(server.modelsDir, 'broken'), { recursive: true });
  });

  it('retrieves a model whose id is as long as a folder name may be', async () => {
    const id = 'm'.repeat(200);
    await cp(path.join(server.modelsDir, 'stub'), path.join(server.modelsDir, id), { recursive: true });
    try {
      expect((await server.client.models.retrieve(id)).id).toBe(id);
    } finally {
      await rm(path.join(server.modelsDir, id), { recursive: true });
    }
  });

  it('never runs the engine for an invalid request', async () => {
    const before = server.engine.batches.length;
    await apiError(generate({ n: 11 }));
    expect(server.engine.batches.length).toBe(before);
  });
});

describe('authentication', () => {
  const withKey = (apiKey: string) => new OpenAI({ baseURL: server.baseURL, apiKey, maxRetries: 0 });

  it('rejects a wrong key with invalid_api_key and a Bearer challenge', async () => {
    const err = await apiError(generate({}, withKey('sk-wrong-key-000000')));
    expect(err).toBeInstanceOf(OpenAI.AuthenticationError);
    expect({ status: err.status, type: err.type, param: err.param, code: err.code }).toEqual({ status: 401, type: 'invalid_request_error', param: null, code: 'invalid_api_key' });
    expect(err.headers?.get('www-authenticate')).toBe('Bearer realm="imagegen"');
    expect(err.message).not.toContain('sk-wrong-key-000000');
    // Named as OpenAI names it: its first 3 and last 4 characters, the rest masked.
    expect((err.error as { message: string }).message).toBe(`Incorrect API key provided: sk-${'*'.repeat(12)}0000.`);
  });

  it('rejects a wrong key of any length, however short, with the same 401 and all of it masked', async () => {
    for (const key of ['k', 'abcde', 'abcdefg', 'abcdefghij']) {
      const err = await apiError(generate({}, withKey(key)));
      expect({ status: err.status, code: err.code, message: (err.error as { message: string }).message }).toEqual({ status: 401, code: 'invalid_api_key', message: `Incorrect API key provided: ${'*'.repeat(key.length)}.` });
    }
  });

  it('rejects a missing key like OpenAI, with code null', async () => {
    const res = await fetch(`${server.baseURL}/images/generations`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'stub', prompt: 'x' }),
    });
    expect(res.status).toBe(401);
    expect(res.headers.get('www-authenticate')).toBe('Bearer realm="imagegen"');
    const body = await res.json();
    expect(body.error).toMatchObject({ type: 'invalid_request_error', param: null, code: null });
    expect(body.error.message).toMatch(/^You didn't provide an API key/);
  });

  it('refuses the key as a Basic password (OpenAI takes it so), saying why and how to send it', async () => {
    const res = await fetch(`${server.baseURL}/images/generations`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Basic ${Buffer.from(`:${TEST_KEY}`).toString('base64')}` },
      body: JSON.stringify({ model: 'stub', prompt: 'x' }),
    });
    expect(res.status).toBe(401);
    const body = await res.json();
    expect(body.error).toMatchObject({ type: 'invalid_request_error', param: null, code: null });
    expect(body.error.message).toBe(
      "Basic auth is not accepted here (a browser would send it on any web page's behalf). You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY) (with curl, -H 'Authorization: Bearer YOUR_KEY' rather than -u :YOUR_KEY).",
    );
  });

  it('guards the models endpoints but not /health or image files', async () => {
    expect((await fetch(`${server.baseURL}/models`)).status).toBe(401);
    expect((await fetch(`${server.origin}/health`)).status).toBe(200);
    const { data } = await generate({});
    expect((await fetch(data![0].url!)).status).toBe(200);
  });

  it('accepts any of several keys', async () => {
    const multi = await startTestServer({ apiKeys: ['sk-first-1234567', TEST_KEY] });
    try {
      expect((await generate({}, multi.client)).data).toHaveLength(1);
    } finally {
      await multi.close();
    }
  });
});

describe('models', () => {
  it('lists installed models and aliases in OpenAI shape with their sizes', async () => {
    const list = await server.client.models.list();
    const models = list.data.map((m) => ({ ...m }));
    expect(models.map((m) => m.id)).toEqual(['stub', 'dall-e-3']);
    for (const m of models) {
      expect(m).toMatchObject({ object: 'model', owned_by: 'user', sizes: STUB_SIZES, default_size: '64x64' });
      expect(Number.isInteger(m.created)).toBe(true);
    }
  });

  it("marks DEFAULT_MODEL's entry as the default, and no alias of it", async () => {
    const withDefault = await startTestServer({ config: { defaultModel: 'stub' } });
    try {
      const { data } = await withDefault.client.models.list();
      expect(data.map((m) => [m.id, (m as unknown as ModelObject).default])).toEqual([
        ['stub', true],
        ['dall-e-3', false],
      ]);
      expect(await withDefault.client.models.retrieve('stub')).toMatchObject({ default: true });
    } finally {
      await withDefault.close();
    }
  });

  it('retrieves one model, by id or alias', async () => {
    expect(await server.client.models.retrieve('dall-e-3')).toMatchObject({ id: 'dall-e-3', object: 'model', default_size: '64x64' });
    const err = await apiError(server.client.models.retrieve('nope'));
    expect(err).toBeInstanceOf(OpenAI.NotFoundError);
    expect({ param: err.param, code: err.code }).toEqual({ param: 'model', code: 'model_not_found' });
  });
});

describe('backpressure and cancellation', () => {
  // A fake engine: these hold a job running (hold()) while others come, which a real generation does not wait for.
  it('answers 429 with Retry-After when the queue is full, and /health meanwhile', async () => {
    const engine = new FakeEngine(1, 0);
    const busy = await startTestServer({ engine });
    try {
      engine.hold();
      const first = generate({}, busy.client);
      await expect.poll(() => engine.load().running).toBe(1);

      const started = performance.now();
      const health = await fetch(`${busy.origin}/health`);
      expect(await health.json()).toEqual({ status: 'ok', queue: { running: 1, queued: 0 } });
      // The job is held until released below: a /health that waited behind it would never answer. The
      // bound only turns that hang into a quick failure, far above a loaded machine's round trip (1 s was near it).
      expect(performance.now() - started).toBeLessThan(10_000);

      const err = await apiError(generate({}, busy.client));
      expect(err).toBeInstanceOf(OpenAI.RateLimitError);
      expect({ status: err.status, code: err.code }).toEqual({ status: 429, code: 'rate_limit_exceeded' });
      expect(Number(err.headers?.get('retry-after'))).toBeGreaterThanOrEqual(1);
      engine.release();
      expect((await first).data).toHaveLength(1);
    } finally {
      engine.release();
      await busy.close();
    }
  });

  it('drops a queued job when its client disconnects', async () => {
    const engine = new FakeEngine(1, 4);
    const busy = await startTestServer({ engine });
    try {
      engine.hold();
      const first = generate({}, busy.client);
      await expect.poll(() => engine.load().running).toBe(1);
      const abort = new AbortController();
      const second = busy.client.images.generate({ model: 'stub', prompt: 'later' }, { signal: abort.signal }).catch(() => 'aborted');
      await expect.poll(() => engine.load().queued).toBe(1);
      abort.abort();
      expect(await second).toBe('aborted');
      await expect.poll(() => engine.load().queued).toBe(0);
      engine.release();
      await first;
      expect(engine.batches.map((b) => b.items[0].prompt)).toEqual(['a red circle']);
    } finally {
      engine.release();
      await busy.close();
    }
  });
});

describe('waits', () => {
  it('bounds all of a request\'s waits together by QUEUE_TIMEOUT_SECONDS: what it waited for room for its answer counts in the queue', async () => {
    const engine = new FakeEngine(1, 4, 3000);
    // Room for one b64_json answer's most (a 64x64 PNG's, 14 KB) at a time.
    const busy = await startTestServer({ engine, config: { answerMemory: 20_000, queueTimeoutSeconds: 3 } });
    try {
      engine.hold();
      const gone = new AbortController();
      const first = busy.client.images.generate({ model: 'stub', prompt: 'first', response_format: 'b64_json' }, { signal: gone.signal, maxRetries: 0 }).catch(() => 'gone');
      await expect.poll(() => engine.load().running).toBe(1);
      const came = performance.now();
      const late = apiError(busy.client.images.generate({ model: 'stub', prompt: 'late', response_format: 'b64_json' }, { maxRetries: 0 }));
      // It waits for the room the first one set aside; its client leaving gives it back, and the late
      // one queues behind its job, which runs on (a running job is never interrupted).
      await new Promise((resolve) => setTimeout(resolve, 1500));
      gone.abort();
      expect(await first).toBe('gone');
      const err = await late;
      expect({ status: err.status, code: err.code }).toEqual({ status: 503, code: 'queue_timeout' });
      // About 3 s in all. Before, its time in the queue was bounded afresh: 1.5 + 3 s.
      expect(performance.now() - came).toBeLessThan(4000);
      expect(err.message).toMatch(/waited 3s/);
    } finally {
      engine.release();
      await busy.close();
    }
  });
});

describe('image store limits', () => {
  it('stores none of the images when they do not fit, so a failed response leaves nothing behind', async () => {
    const sizes = (await generate({ n: 2, seed: 5, response_format: 'b64_json' })).data!.map((image) => Buffer.from(image.b64_json!, 'base64').length);
    // Room for the first image, not for both; the space a request's images may take is reserved before
    // they are generated (test/store-reservation.test.ts), so this one is refused before any work.
    const tight = await startTestServer({ maxStoreBytes: sizes[0] + sizes[1] - 1 });
    try {
      const err = await apiError(generate({ n: 2, seed: 5 }, tight.client));
      expect({ status: err.status, code: err.code }).toEqual({ status: 507, code: 'storage_full' });
      expect(tight.engine.batches).toHaveLength(0);
      expect(tight.store.stats()).toEqual({ files: 0, bytes: 0 });
      expect(await readdir(tight.dataDir)).toEqual([]);
      expect((await generate({ n: 2, seed: 5, response_format: 'b64_json' }, tight.client)).data).toHaveLength(2);
    } finally {
      await tight.close();
    }
  });


  it('answers 507 storage_full, not to be retried, when URLs cannot be stored; b64_json still works', async () => {
    const full = await startTestServer({ maxStoreBytes: 10 });
    try {
      const err = await apiError(generate({}, full.client));
      expect(err).toBeInstanceOf(OpenAI.InternalServerError);
      expect({ status: err.status, type: err.type, code: err.code }).toEqual({ status: 507, type: 'server_error', code: 'storage_full' });
      expect(err.headers?.get('x-should-retry')).toBe('false');
      expect((await generate({ response_format: 'b64_json' }, full.client)).data).toHaveLength(1);
    } finally {
      await full.close();
    }
  });
});

describe('shutdown', () => {
  /** A test server whose fake engine holds a generation running (until engine.release()), as the close begins. */
  async function serverWithHeldGeneration(options: Omit<Parameters<typeof startTestServer>[0], 'engine'> = {}) {
    const engine = new FakeEngine();
    const closing = await startTestServer({ ...options, engine });
    engine.hold();
    const running = generate({}, closing.client);
    await expect.poll(() => engine.load().running).toBe(1);
    return { engine, closing, running };
  }

  it('lets a running generation finish, then closes promptly despite idle and unused connections', async () => {
    // The generation is held running until the close has begun.
    const { engine, closing, running } = await serverWithHeldGeneration();
    // A connection that never sends a request: Node alone would wait for it.
    const spare = net.connect(Number(new URL(closing.origin).port), '127.0.0.1').on('error', () => undefined);
    await new Promise((resolve) => spare.once('connect', resolve));
    const closed = closing.close();
    await new Promise((resolve) => setTimeout(resolve, 50));
    engine.release();
    expect((await running).data).toHaveLength(1);
    const started = performance.now();
    await closed;
    // Node alone waits for the unused connection's HEADERS_TIMEOUT_SECONDS (30 s) and the idle one's
    // KEEP_ALIVE_TIMEOUT_SECONDS (72 s): a third of the shorter still tells those apart from a close that
    // waits for neither, and leaves a loaded machine room (1 s was near its close's own time).
    expect(performance.now() - started).toBeLessThan(10_000);
    spare.destroy();
  });

  it("closes the connection of each answer sent while it closes, where a balancer's pool sent its next request to get the 503", async () => {
    // A generation held running keeps the server closing until it ends.
    const logs = capturedLogs<{ msg: string }>();
    const { engine, closing, running } = await serverWithHeldGeneration({ logger: logs.logger });
    // A request under way on a keep-alive connection as the close begins: its body not sent yet (the 100
    // Continue says the server has taken it). Its answer, a 400, comes during the close.
    const body = JSON.stringify({ model: 'stub', prompt: 'a red circle', n: 0 });
    const head = `POST /v1/images/generations HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer ${TEST_KEY}\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\nexpect: 100-continue\r\n\r\n`;
    const exchange = rawRequest(Number(new URL(closing.origin).port), head);
    await expect.poll(() => exchange.text).toMatch(/^HTTP\/1\.1 100 Continue/);
    const closed = closing.close();
    // Its body once the close has begun (a stall of this process could let a fixed wait end before).
    await expect.poll(() => logs.lines.some((line) => line.msg === 'waiting for requests in flight to finish')).toBe(true);
    exchange.socket.write(body);
    await expect.poll(() => exchange.text).toMatch(/"code":"integer_below_min_value"}}$/);
    const answer = parseResponse(exchange.text);
    expect(answer.status).toBe('HTTP/1.1 400 Bad Request');
    // Before, 'keep-alive': the connection stayed open until the generation ended, and a request sent on it got 503 server_shutting_down.
    expect(answer.headers.connection).toBe('close');
    await exchange.closed;
    expect(engine.load().running).toBe(1);
    engine.release();
    expect((await running).data).toHaveLength(1);
    await closed;
  });

  it('says the 503s of a shutdown (requests cancelled at its deadline, requests arriving during it) at info, not as errors', async () => {
    const logs = capturedLogs<{ level: number; msg: string; code?: string }>();
    // The engine's job holds the only worker (a running job is not interrupted); the second waits for it.
    const held = await serverWithHeldGeneration({ logger: logs.logger, config: { shutdownTimeoutSeconds: 0 } });
    const { engine, closing } = held;
    const running = held.running.catch((err: unknown) => err);
    const waiting = generate({}, closing.client).catch((err: unknown) => err);
    await expect.poll(() => engine.load().queued).toBe(1);
    const closed = closing.close();
    expect(await waiting).toMatchObject({ status: 503, code: 'server_shutting_down' });
    engine.release();
    await running;
    await closed;
    // The shutdown's own warning says that it cancelled requests; each one's 503 is no failure of the server's.
    expect(logs.lines.filter((line) => line.level >= 50)).toEqual([]);
    expect(logs.lines.some((line) => line.level === 40 && line.msg.startsWith('shutdown deadline passed'))).toBe(true);
  });
});

describe('image URLs', () => {
  it('follow X-Forwarded-Proto and X-Forwarded-Host from a trusted proxy', async () => {
    const res = await fetch(`${server.baseURL}/images/generations`, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        authorization: `Bearer ${TEST_KEY}`,
        'x-forwarded-proto': 'https',
        'x-forwarded-host': 'images.example.com',
      },
      body: JSON.stringify({ model: 'stub', prompt: 'x' }),
    });
    const body = await res.json();
    expect(body.data[0].url).toMatch(/^https:\/\/images\.example\.com\/v1\/images\/files\/[0-9a-f]{32}\.png$/);
  });

  it('ignore proxy headers unless trusted, and use PUBLIC_BASE_URL when set', async () => {
    const headers = { 'x-forwarded-host': 'evil.example.com' };
    const untrusted = await startTestServer({ config: { trustProxy: false } });
    const fixed = await startTestServer({ config: { publicBaseUrl: 'https://img.example.com/gen' } });
    try {
      const a = await generate({}, new OpenAI({ baseURL: untrusted.baseURL, apiKey: TEST_KEY, defaultHeaders: headers }));
      expect(a.data![0].url!.startsWith(`${untrusted.origin}/v1/images/files/`)).toBe(true);
      const b = await generate({}, fixed.client);
      expect(b.data![0].url).toMatch(/^https:\/\/img\.example\.com\/gen\/v1\/images\/files\//);
    } finally {
      await untrusted.close();
      await fixed.close();
    }
  });
});
