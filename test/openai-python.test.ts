import { execFile } from 'node:child_process';
import { copyFile, mkdtemp, readFile, truncate, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEMO_MODEL_DIR } from './helpers/demo-model.js';
import { PROJECT_ROOT } from './helpers/cli.js';
import { untilReady } from './helpers/ops-server.js';
import { CURRENT_OPENAI_PYTHON, openaiPython } from './helpers/openai-python.js';
import { readImageFile } from './helpers/picture.js';
import { startRealServer, type RealServer } from './helpers/real-server.js';

/**
 * The official openai-python, the current major (3.x) and the one before (2.x), against the whole
 * server on the embedded demo model, as Python users call it: every check is a call in one script
 * (helpers/openai-python-checks.py, one process per version), and the test asserts on what it printed
 * and decodes with sharp the images it got. The server runs one worker with QUEUE_MAX=0, so that a
 * request while a generation runs gets a 429 with a Retry-After of a few seconds, which the SDK's own
 * retries wait out; a copy of the demo model damaged after the scan gives the 500s.
 */

const run = promisify(execFile);
const VERSIONS = [CURRENT_OPENAI_PYTHON, '2.54.0'] as const;
const pythons = await Promise.all(VERSIONS.map(openaiPython));

const KEY = 'sk-python-0123456789';
/** API_KEYS_FILE's key that may have 2 images a minute. */
const LIMITED_KEY = 'sk-python-limited-0123456789';
const CHECKS = path.join(PROJECT_ROOT, 'test', 'helpers', 'openai-python-checks.py');
/**
 * Each version's own damaged model, cut short as its checks begin, after the scans that found it whole
 * (a failed load has the server check every model again): its first request meets the failure as the
 * worker loads it (in a stream: an error event after the 200), the later ones a model known to be
 * unusable (a 500 up front).
 */
const damagedModel = (version: string) => `damaged-${version}`;

/** The address docs/api.md's examples use, replaced by the test server's. */
const DOCS_ADDRESS = 'http://127.0.0.1:8000/v1';

/** docs/api.md's examples for openai-python (those that make a client or use one; not diffusers'). */
const docsExamples = async () => {
  const text = await readFile(path.join(PROJECT_ROOT, 'docs', 'api.md'), 'utf8');
  return [...text.matchAll(/```python\n([^]*?)```/g)].map((match) => match[1]).filter((code) => code.includes('client'));
};

interface Described {
  class: string;
  message: string;
  status?: number;
  code?: string | null;
  param?: string | null;
  type?: string | null;
  request_id?: string;
  retry_after?: string | null;
  should_retry?: string | null;
}

type Result<T = unknown> = { ok: T; error?: undefined } | { ok?: undefined; error: Described };

interface StreamedEvent {
  class: string;
  instance: boolean;
  type: string;
  index: number | null;
  size: string | null;
  /** The fields the SDK's class does not declare: the image's `seed`, a progress event's own. */
  extra: Record<string, number>;
  file: string | null;
}

interface Sent<T = unknown> {
  ok?: T;
  error?: Described;
  requests: { retry: string; bytes: number }[];
  statuses: [number, string | null][];
}

let real: RealServer;
let inputs: string;

beforeAll(async () => {
  if (pythons.every((python) => 'missing' in python)) return;
  const keys = path.join(await mkdtemp(path.join(os.tmpdir(), 'openai-python-')), 'keys');
  await writeFile(keys, `limited:${LIMITED_KEY} images_per_minute=2\n`);
  real = await startRealServer({
    apiKey: KEY,
    models: Object.fromEntries(VERSIONS.map((version) => [damagedModel(version), { copy: DEMO_MODEL_DIR }])),
    env: { WORKERS: '1', QUEUE_MAX: '0', API_KEYS_FILE: keys },
  });
  await untilReady(real.server.url, 60_000);
  inputs = await mkdtemp(path.join(os.tmpdir(), 'openai-python-inputs-'));
  const grey = { r: 128, g: 128, b: 128 };
  const square = await sharp({ create: { width: 200, height: 200, channels: 3, background: { r: 0, g: 0, b: 255 } } }).png().toBuffer();
  await sharp({ create: { width: 512, height: 512, channels: 3, background: grey } }).composite([{ input: square, left: 156, top: 156 }]).png().toFile(path.join(inputs, 'in.png'));
  // Transparent (to redraw) over the top half.
  const top = await sharp({ create: { width: 512, height: 256, channels: 4, background: { r: 0, g: 0, b: 0, alpha: 0 } } }).png().toBuffer();
  await sharp({ create: { width: 512, height: 512, channels: 4, background: { ...grey, alpha: 1 } } }).composite([{ input: top, left: 0, top: 0, blend: 'source' }]).png().toFile(path.join(inputs, 'mask.png'));
  await sharp({ create: { width: 256, height: 256, channels: 3, background: { r: 255, g: 0, b: 0 } } }).jpeg().toFile(path.join(inputs, 'in.jpg'));
}, 120_000);

afterAll(() => real?.close());

/** Runs the checks with the openai-python at `python`; its images land in `out`. */
async function runChecks(version: string, python: string, out: string): Promise<{ version: string; results: Record<string, unknown>; work: string }> {
  // Each version's own folder: the docs' examples write files beside their inputs.
  const work = await mkdtemp(path.join(os.tmpdir(), 'openai-python-work-'));
  for (const [from, to] of [['in.png', 'in.png'], ['mask.png', 'mask.png'], ['in.jpg', 'in.jpg'], ['in.png', 'room.png'], ['mask.png', 'window-transparent.png'], ['in.png', 'cat.png']]) {
    await copyFile(path.join(inputs, from), path.join(work, to));
  }
  await truncate(path.join(real.root, 'models', damagedModel(version), 'text_encoder', 'model.onnx'), 2000);
  const docs = (await docsExamples()).map((code) => code.replaceAll(DOCS_ADDRESS, real.baseURL));
  const config = path.join(work, 'config.json');
  await writeFile(config, JSON.stringify({ baseURL: real.baseURL, key: KEY, limitedKey: LIMITED_KEY, damaged: damagedModel(version), work, out, docs }));
  const { stdout } = await run(python, [CHECKS, config], { maxBuffer: 64 * 1024 ** 2, timeout: 120_000 });
  return { ...(JSON.parse(stdout) as { version: string; results: Record<string, unknown> }), work };
}

for (const [i, version] of VERSIONS.entries()) {
  const python = pythons[i];
  const missing = 'missing' in python ? python.missing : undefined;
  const major = Number.parseInt(version, 10);

  describe.skipIf(missing !== undefined)(`openai-python ${version}${missing ? ` (skipped: ${missing})` : ''}`, () => {
    let results: Record<string, unknown>;
    let out: string;
    /** The folder the docs' examples ran in. */
    let work: string;
    const result = <T>(name: string) => {
      expect(results, name).toHaveProperty([name]);
      return results[name] as Result<T>;
    };
    /** A check that must have succeeded: its value. */
    const ok = <T>(name: string): T => {
      const { ok, error } = result<T>(name);
      expect(error, name).toBeUndefined();
      return ok as T;
    };
    /** A check that must have raised: what the SDK raised. */
    const error = (name: string): Described => {
      const { error } = result(name);
      expect(error, `${name} raised nothing`).toBeDefined();
      return error!;
    };
    const image = async (file: string) => readImageFile(await readFile(path.join(out, file)));
    const metadata = async (file: string) => {
      const { format, width, height } = await sharp(path.join(out, file)).metadata();
      return `${format} ${width}x${height}`;
    };

    beforeAll(async () => {
      out = await mkdtemp(path.join(os.tmpdir(), `openai-python-${version}-`));
      const printed = await runChecks(version, (python as { python: string }).python, out);
      expect(printed.version).toBe(version);
      ({ results, work } = printed);
    }, 120_000);

    it('generates url and b64_json images, n from 1 to 4, at every size the model lists', async () => {
      expect(await metadata(ok<string[]>('url')[0])).toBe('png 256x256');
      for (let n = 1; n <= 4; n++) {
        const files = ok<string[]>(`n${n}`);
        expect(files).toHaveLength(n);
        for (const file of files) {
          const { info, reading } = await image(file);
          expect([info.width, info.height, reading.colour]).toEqual([256, 256, 'red']);
        }
      }
      const listed = (await real.client.models.retrieve('demo-shapes')) as unknown as { sizes: string[] };
      expect(ok('sizes')).toEqual(listed.sizes);
      for (const size of listed.sizes) expect(await metadata(ok<string[]>(`size ${size}`)[0])).toBe(`png ${size}`);
      for (const quality of ['standard', 'hd', 'low', 'medium', 'high', 'xhigh', 'max', 'auto']) expect(ok(`quality ${quality}`)).toBe(1);
      // The same seed, the same picture; None for an optional field is as good as leaving it out.
      expect(ok('seed')).toBe(1);
      expect(ok('nulls')).toBe(1);
    });

    it("takes gpt-image's fields (output_format, output_compression, background, moderation, user) and echoes its settings", async () => {
      for (const format of ['png', 'jpeg', 'webp']) {
        const { files, settings } = ok<{ files: string[]; settings: Record<string, unknown> }>(`format ${format}`);
        expect(await metadata(files[0])).toBe(`${format} 1024x1024`);
        expect(settings).toMatchObject({ output_format: format, background: 'opaque', quality: 'low', size: '1024x1024', safety_identifier: 'user-1' });
        expect(settings.usage).toMatchObject({ output_tokens: 4096, input_tokens_details: { image_tokens: 0 } });
      }
      expect(error('transparent')).toMatchObject({ class: 'BadRequestError', status: 400, param: 'background', code: 'unsupported_value' });
    });

    it(
      major < 3
        ? "is told only the sizes its types allow (2.x types them as the three gpt-image sizes): strict validation passes"
        : 'is told the size drawn, any WxH (3.x types it as a string), under strict validation',
      () => {
        // A 512-pixel model's `auto`, in an answer and in each streamed event, with _strict_response_validation=True.
        const answered = ok<Record<string, unknown>>('auto size, strict');
        const streamed = ok<StreamedEvent[]>('stream strict');
        if (major < 3) {
          expect(answered).not.toHaveProperty('size');
          expect(streamed.map((event) => event.size)).toEqual(['auto', 'auto']);
        } else {
          expect(answered.size).toBe('512x512');
          expect(streamed.map((event) => event.size)).toEqual(['512x512', '512x512']);
        }
        expect(answered).toMatchObject({ output_format: 'png', quality: 'low', background: 'opaque' });
      },
    );

    it('edits an image given as a file, a tuple, bytes, a BytesIO, a Path or a list of one, with a mask; and makes variations', async () => {
      for (const way of ['file', 'tuple', 'octet-stream tuple', 'bytes', 'BytesIO', 'Path', 'list of one']) {
        expect(await metadata(ok<string[]>(`edit ${way}`)[0]), way).toBe('png 256x256');
      }
      const masked = ok<{ files: string[]; settings: Record<string, unknown> }>('edit mask');
      expect(await Promise.all(masked.files.map(metadata))).toEqual(['webp 512x512', 'webp 512x512']);
      expect(masked.settings).toMatchObject({ output_format: 'webp', usage: { input_tokens_details: { image_tokens: 1024 } } });
      const variations = ok<string[]>('variation');
      expect(await Promise.all(variations.map(metadata))).toEqual(['png 256x256', 'png 256x256', 'png 256x256']);
      expect(await metadata(ok<string[]>('variation jpeg')[0])).toBe('png 256x256');
      expect(error('edit several')).toMatchObject({ class: 'BadRequestError', param: 'image', code: 'too_many_images' });
      expect(error('edit not an image')).toMatchObject({ class: 'BadRequestError', param: 'image', code: 'invalid_image_format' });
      expect(error('edit mask of another size')).toMatchObject({ class: 'BadRequestError', param: 'mask', code: 'invalid_mask' });
    });

    it('streams generations and edits as the SDK types their events, partial_images 0 to 3', async () => {
      for (const [check, prefix, partialClass, completedClass] of [
        ['stream', 'image_generation', 'ImageGenPartialImageEvent', 'ImageGenCompletedEvent'],
        ['edit stream', 'image_edit', 'ImageEditPartialImageEvent', 'ImageEditCompletedEvent'],
      ]) {
        for (let partials = 0; partials <= 3; partials++) {
          const events = ok<StreamedEvent[]>(`${check} ${partials}`);
          expect(events.map((event) => [event.class, event.type, event.index, event.instance])).toEqual([
            ...Array.from({ length: partials }, (_, index) => [partialClass, `${prefix}.partial_image`, index, true]),
            [completedClass, `${prefix}.completed`, null, true],
          ]);
          // One image: every event is its, previews included.
          expect(new Set(events.map((event) => event.extra.seed)).size).toBe(1);
          for (const event of events) expect(await metadata(event.file!)).toBe('png 512x512');
        }
      }
      const two = ok<StreamedEvent[]>('stream n2');
      expect(two.map((event) => event.type)).toEqual(['image_generation.partial_image', 'image_generation.partial_image', 'image_generation.completed', 'image_generation.completed']);
      expect(new Set(two.slice(2).map((event) => event.extra.seed)).size).toBe(2);
      // The extension's progress events come as the SDK's partial-image class (docs/api.md says so).
      const progress = ok<StreamedEvent[]>('stream progress');
      expect(progress.at(-1)).toMatchObject({ class: 'ImageGenCompletedEvent', type: 'image_generation.completed' });
      expect(progress.slice(0, -1).map((event) => [event.class, event.type])).toEqual(progress.slice(0, -1).map(() => ['ImageGenPartialImageEvent', 'imagegen.progress']));
      // Their own fields read as attributes: the queue, then the steps up to the last.
      expect(progress[0].extra).toEqual({ queued_ahead: 0 });
      const last = progress.at(-2)!.extra;
      expect(last.step).toBe(last.steps);
      // Refused before the stream: the status's class. Failing after it began: an error event, raised as APIError.
      expect(error('stream refused')).toMatchObject({ class: 'BadRequestError', status: 400, param: 'size', code: 'invalid_value' });
      expect(error('stream failing')).toMatchObject({ class: 'APIError', code: 'model_unusable', type: 'server_error' });
    });

    it('gives request ids on results, raw and streamed responses', () => {
      const raw = ok<Record<string, unknown>>('raw');
      expect(raw).toMatchObject({ status: 200, parsed: 'ImagesResponse' });
      expect(raw.request_id).toMatch(/^req_[0-9a-f]{32}$/);
      expect([raw.header, raw._request_id]).toEqual([raw.request_id, raw.request_id]);
      expect(ok('streaming response')).toEqual({ status: 200, content_type: 'application/json; charset=utf-8', images: 1 });
    });

    it('lists and retrieves models', async () => {
      const ids = (await real.client.models.list()).data.map((model) => model.id);
      expect(ok('models')).toEqual(ids.map((id) => [id, 'model', 'Model']));
      expect(ids).toEqual(expect.arrayContaining(['demo-shapes', 'dall-e-2', 'dall-e-3', 'gpt-image-1']));
      expect(ok('model')).toEqual({ id: 'dall-e-3', object: 'model', owned_by: 'imagegen' });
      expect(error('missing model')).toMatchObject({ class: 'NotFoundError', status: 404, param: 'model', code: 'model_not_found' });
    });

    it('raises each status as its exception class, with code, param and request id', () => {
      const expected: [string, string, number, string | null, string | null][] = [
        ['bad key', 'AuthenticationError', 401, null, 'invalid_api_key'],
        ['unknown model', 'BadRequestError', 400, 'model', 'invalid_value'],
        ['bad size', 'BadRequestError', 400, 'size', 'invalid_value'],
        ['n 11', 'BadRequestError', 400, 'n', 'integer_above_max_value'],
        ['unknown field', 'BadRequestError', 400, 'colour', 'unknown_parameter'],
        ['unknown path', 'NotFoundError', 404, null, null],
        // openai-python has no class of its own for these.
        ['other method', 'APIStatusError', 405, null, 'method_not_allowed'],
        ['json variation', 'APIStatusError', 415, null, 'unsupported_media_type'],
        ['large upload', 'APIStatusError', 413, 'image', 'request_too_large'],
      ];
      for (const [check, kind, status, param, code] of expected) {
        const raised = error(check);
        expect({ check, kind: raised.class, status: raised.status, param: raised.param, code: raised.code }).toEqual({ check, kind, status, param, code });
        expect(raised.request_id, check).toMatch(/^req_[0-9a-f]{32}$/);
      }
      expect(error('unknown model').type).toBe('image_generation_user_error');
      expect(error('timeout').class).toBe('APITimeoutError');
    });

    it("retries what the server says to retry, after its Retry-After, an edit's form sent again whole; and nothing else", async () => {
      // A request for more images than the key may have in a minute, and a damaged model: x-should-retry false, sent once.
      const overKey = results["over a key's images"] as Sent;
      expect(overKey.error).toMatchObject({ class: 'RateLimitError', status: 429, code: 'rate_limit_exceeded', should_retry: 'false' });
      expect(overKey.requests).toHaveLength(1);
      const damaged = results['damaged model'] as Sent;
      expect(damaged.error).toMatchObject({ class: 'InternalServerError', status: 500, code: 'model_unusable', type: 'server_error', should_retry: 'false' });
      expect(damaged.requests).toHaveLength(1);
      // A full queue (the only worker busy): a 429 with a Retry-After, waited out, then the edit again whole.
      const retried = results['edit retried'] as Sent<string[]>;
      expect(retried.error).toBeUndefined();
      expect(retried.statuses[0][0]).toBe(429);
      expect(Number(retried.statuses[0][1])).toBeGreaterThanOrEqual(1);
      expect(retried.statuses.at(-1)).toEqual([200, null]);
      expect(retried.requests.map((request) => request.retry)).toEqual(retried.statuses.map((_, n) => String(n)));
      expect(new Set(retried.requests.map((request) => request.bytes)).size).toBe(1);
      const { info, reading } = await image(retried.ok![0]);
      expect([info.width, info.height, reading.colour]).toEqual([256, 256, 'red']);
      // The same refusal without retries: RateLimitError, saying when to try again.
      const refused = results['refused without retries'] as Sent;
      expect(refused.error).toMatchObject({ class: 'RateLimitError', status: 429, code: 'rate_limit_exceeded' });
      expect(Number(refused.error!.retry_after)).toBeGreaterThanOrEqual(1);
      expect(refused.requests).toHaveLength(1);
    });

    it('works with AsyncOpenAI: requests at once, an edit, a stream, models and errors', async () => {
      const done = ok<{ files: string[]; events: string[]; models: number; error: string }>('async');
      expect(await Promise.all(done.files.map(metadata))).toEqual(Array.from({ length: 7 }, () => 'png 256x256'));
      expect(done.events).toEqual(['ImageGenPartialImageEvent', 'ImageGenCompletedEvent']);
      expect(done.models).toBe((await real.client.models.list()).data.length);
      expect(done.error).toBe('BadRequestError');
    });

    it("runs docs/api.md's examples as written", async () => {
      const examples = await docsExamples();
      expect(examples.filter((code) => code.includes(DOCS_ADDRESS)).length).toBeGreaterThan(0);
      const ran = ok<{ images: number | null; printed: string; files: string[] }[]>('docs');
      expect(ran).toHaveLength(examples.length);
      // A generation (n=2, its URL printed), a stream (previews, then the picture), a client whose timeout
      // outlasts a long generation (made, no request), an edit with a mask (n=2), variations (n=3).
      expect(ran.map((example) => example.images)).toEqual([2, null, null, 2, 3]);
      expect(ran[0].printed).toMatch(new RegExp(`^${real.baseURL}/images/files/[0-9a-f]{32}\\.png\\n$`));
      expect(ran[1].files).toEqual(expect.arrayContaining(['lighthouse.png', 'preview-0.png', 'preview-1.png']));
      for (const file of ['lighthouse.png', 'preview-0.png']) expect((await sharp(path.join(work, file)).metadata()).width).toBe(512);
    });
  });
}
