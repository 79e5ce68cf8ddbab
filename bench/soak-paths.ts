import sharp from 'sharp';
import { MAX_UPLOAD_BYTES } from '../src/http/uploads.js';

/**
 * The requests the soak benchmark (soak.ts) can send, by name (`--paths`): every route and the ways a
 * request can end (answered, refused, abandoned by its client), each checked for the outcome it should
 * have. A path's run answers its outcome (the status, or `aborted` where the client left on purpose),
 * which the soak counts; an outcome the path does not expect throws, and counts as a failure.
 */

export interface SoakTarget {
  /** The API base URL (ending in /v1) and the origin. */
  baseURL: string;
  origin: string;
  /** A key without limits, and one of `requests_per_minute=1` (the 429s of a key's own limit). */
  key: string;
  limitedKey: string;
  /** A 256x256 noisy PNG (about 200 KB, so that uploads weigh on UPLOAD_MEMORY) and a mask of its size, its left half transparent. */
  image: Blob;
  mask: Blob;
  /** `image` as a data URI, for the JSON form of an edit. */
  imageUri: string;
  /** The URL of an image stored lately (the `files` path's subject), and when it was made. */
  recent?: { url: string; at: number };
}

export interface SoakPath {
  /** Sends request `i` of this path and answers its outcome; throws for an outcome the path does not expect. */
  run(i: number, target: SoakTarget, size: string, steps: number): Promise<string>;
  /** Needs server settings to reach its refusals (the soak's run sets none of them by itself). */
  needs?: string;
}

const PROMPTS = ['a red circle', 'a big blue square', 'a small green triangle', 'a yellow circle on the left', 'an orange square'];
/**
 * Request i's prompt: one of PROMPTS with a word of its own (i in letters), so that a cache kept per
 * prompt or per word (the tokenizers') meets as many as the requests, as with real users' prompts.
 */
const prompt = (i: number) => `${PROMPTS[i % PROMPTS.length]}, ${[...i.toString(26)].map((digit) => String.fromCharCode(97 + parseInt(digit, 26))).join('')}`;
/** A URL's stored image serves the `files` path until it is this old (images live IMAGE_TTL_SECONDS, 60 in the soak). */
const RECENT_MS = 20_000;

export async function soakPictures(): Promise<Pick<SoakTarget, 'image' | 'mask' | 'imageUri'>> {
  const noise = Buffer.from(Array.from({ length: 256 * 256 * 3 }, (_, i) => (i * 2654435761) >>> 24));
  const image = await sharp(noise, { raw: { width: 256, height: 256, channels: 3 } }).png().toBuffer();
  const alpha = Buffer.alloc(256 * 256 * 4, 255);
  for (let p = 0; p < 256 * 256; p++) if (p % 256 < 128) alpha[p * 4 + 3] = 0;
  const mask = await sharp(alpha, { raw: { width: 256, height: 256, channels: 4 } }).png().toBuffer();
  return {
    image: new Blob([new Uint8Array(image)], { type: 'image/png' }),
    mask: new Blob([new Uint8Array(mask)], { type: 'image/png' }),
    imageUri: `data:image/png;base64,${image.toString('base64')}`,
  };
}

type Body = Record<string, unknown>;
interface Answer {
  status: number;
  json?: { data?: { url?: string; b64_json?: string }[]; error?: { code?: string | null } };
}

const auth = (key: string) => ({ authorization: `Bearer ${key}` });

/** A response's status and JSON body, read whole. */
const answer = async (res: Response): Promise<Answer> => ({ status: res.status, json: (await res.json()) as Answer['json'] });

/** POSTs a JSON body (or raw text) to an API path and reads the whole answer. */
async function post(target: SoakTarget, route: string, body: Body | string, { key = target.key, signal, type = 'application/json' }: { key?: string; signal?: AbortSignal; type?: string } = {}): Promise<Answer> {
  return answer(await fetch(`${target.baseURL}${route}`, { method: 'POST', headers: { 'content-type': type, ...auth(key) }, body: typeof body === 'string' ? body : JSON.stringify(body), signal }));
}

/** A multipart form: `files` as parts named by their keys (repeated for `image[]`), the rest as text. */
function form(fields: Body, files: [string, Blob][]): FormData {
  const data = new FormData();
  for (const [name, blob] of files) data.append(name, blob, `${name.replace(/\W/g, '')}.png`);
  for (const [name, value] of Object.entries(fields)) data.append(name, String(value));
  return data;
}

/** POSTs a multipart form (see form()) and reads the whole answer. */
async function postForm(target: SoakTarget, route: string, fields: Body, files: [string, Blob][], { key = target.key, signal }: { key?: string; signal?: AbortSignal } = {}): Promise<Answer> {
  return answer(await fetch(`${target.baseURL}${route}`, { method: 'POST', headers: auth(key), body: form(fields, files), signal }));
}

function expect(answer: Answer, ...statuses: number[]): string {
  if (!statuses.includes(answer.status)) throw new Error(`answered ${answer.status} ${answer.json?.error?.code ?? ''}`.trim());
  return String(answer.status);
}

/** A 200 with `n` images; a url answer's first image is fetched back and remembered for the `files` path. */
async function images(target: SoakTarget, answer: Answer, n: number): Promise<string> {
  if (answer.status !== 200) return expect(answer, 200);
  const data = answer.json?.data ?? [];
  if (data.length !== n) throw new Error(`answered ${data.length} images for n=${n}`);
  const url = data[0].url;
  if (url) {
    const image = await fetch(url);
    await image.arrayBuffer();
    if (image.status !== 200) throw new Error(`image URL answered ${image.status}`);
    target.recent = { url, at: Date.now() };
  }
  return '200';
}

const generation = (i: number, size: string, steps: number, fields: Body = {}) => ({
  model: 'demo-shapes',
  prompt: prompt(i),
  n: 1 + (i % 4),
  size,
  steps,
  seed: i,
  ...fields,
});

/** A generation answered in `format`, its images checked (see images()). */
async function generated(i: number, target: SoakTarget, size: string, steps: number, format: 'url' | 'b64_json', signal?: AbortSignal): Promise<string> {
  const body = generation(i, size, steps, { response_format: format });
  return images(target, await post(target, '/images/generations', body, { signal }), body.n);
}

/** Runs `send` with a signal aborted `delayMs` later: a request the client leaves while it waits or runs. */
async function abandoned(delayMs: number, send: (signal: AbortSignal) => Promise<string>): Promise<string> {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), delayMs);
  try {
    return await send(controller.signal);
  } catch (err) {
    if ((err as Error).name === 'AbortError') return 'aborted';
    throw err;
  } finally {
    clearTimeout(timer);
  }
}

/**
 * A streamed answer read as server-sent events: to its end (`leaveAfter` undefined), then checked for
 * `n` completed images and no error event; or until the `leaveAfter`-th event (0: the first bytes), where
 * the client hangs up.
 */
async function streamed(res: Response, n: number, leaveAfter: number | undefined, controller: AbortController): Promise<string> {
  if (res.status !== 200) return expect(await answer(res), 200);
  const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
  let text = '';
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    text += value;
    if (leaveAfter !== undefined && text.split('\n\n').length - 1 > leaveAfter) {
      controller.abort();
      return 'aborted';
    }
  }
  if (text.includes('data: {"error"')) throw new Error(`stream ended with an error event: ${/"code":"?([\w]+)/.exec(text)?.[1]}`);
  const completed = text.split('\n').filter((line) => /^event: \w+\.completed$/.test(line)).length;
  if (completed !== n) throw new Error(`stream sent ${completed} completed images for n=${n}`);
  return leaveAfter === undefined ? '200' : '200 (ended before the client left)';
}

/** Streams request `i` to generations or (every third) edits; `leave` says after how many events the client hangs up. */
async function stream(i: number, target: SoakTarget, size: string, steps: number, leave?: number): Promise<string> {
  const controller = new AbortController();
  const n = 1 + (i % 2);
  const fields = { stream: true, partial_images: i % 4, n, size, steps, seed: i, response_format: 'b64_json' };
  const init = { method: 'POST', headers: auth(target.key), signal: controller.signal };
  try {
    const res =
      i % 3 === 2
        ? await fetch(`${target.baseURL}/images/edits`, { ...init, body: form({ ...fields, model: 'demo-shapes', prompt: prompt(i) }, [['image', target.image]]) })
        : await fetch(`${target.baseURL}/images/generations`, { ...init, headers: { ...init.headers, 'content-type': 'application/json' }, body: JSON.stringify(generation(i, size, steps, fields)) });
    return await streamed(res, n, leave, controller);
  } catch (err) {
    if ((err as Error).name === 'AbortError' && controller.signal.aborted) return 'aborted';
    throw err;
  }
}

/** An edit of the picture: inpainting (with the mask), image-to-image, a variation, the JSON form, by `i`. */
async function edit(i: number, target: SoakTarget, size: string, steps: number, signal?: AbortSignal): Promise<string> {
  const n = 1 + (i % 2);
  const format = i % 3 === 0 ? 'url' : 'b64_json';
  const fields = { prompt: prompt(i), n, size, steps, seed: i, response_format: format };
  switch (i % 4) {
    case 0:
      return images(target, await postForm(target, '/images/edits', fields, [['image', target.image], ['mask', target.mask]], { signal }), n);
    case 1:
      return images(target, await postForm(target, '/images/edits', { ...fields, strength: 0.6 }, [['image[]', target.image]], { signal }), n);
    case 2: {
      // Its default strength, 0.3, runs none of 2 steps (a 400 that names the fewest that work).
      const { prompt: _, ...variation } = fields;
      return images(target, await postForm(target, '/images/variations', { ...variation, strength: 0.6 }, [['image', target.image]], { signal }), n);
    }
    default:
      return images(target, await post(target, '/images/edits', { ...fields, images: [{ image_url: target.imageUri }] }, { signal }), n);
  }
}

/** Requests refused with a 400 family status, one kind after another. */
const BAD: ((target: SoakTarget, size: string) => Promise<string>)[] = [
  async (t) => expect(await post(t, '/images/generations', '{"prompt": "a red', {}), 400),
  async (t) => expect(await post(t, '/images/generations', { prompt: 'a red circle', size: '300x300' }), 400),
  async (t) => expect(await post(t, '/images/generations', { prompt: 'a red circle', size: '99999x99999' }), 400),
  async (t) => expect(await post(t, '/images/generations', { prompt: 'a red circle', n: 11 }), 400),
  async (t) => expect(await post(t, '/images/generations', { prompt: 'a red circle', colour: 'red' }), 400),
  async (t) => expect(await post(t, '/images/generations', { prompt: 'a red circle', model: 'no-such-model' }), 400),
  async (t) => expect(await post(t, '/images/generations', { prompt: 'x'.repeat(1_100_000) }), 413),
  async (t) => expect(await post(t, '/images/generations', 'a red circle', { type: 'text/plain' }), 415),
  async (t, size) => expect(await postForm(t, '/images/edits', { prompt: 'a red circle', size }, [['image[]', t.image], ['image[]', t.image]]), 400),
  async (t, size) => expect(await postForm(t, '/images/edits', { prompt: 'a red circle', size }, [['image', new Blob([new Uint8Array(5000)])]]), 400),
  async (t, size) => expect(await postForm(t, '/images/edits', { prompt: 'a red circle', size }, [['image', t.image], ['mask', t.image]]), 400),
  async (t, size) => expect(await postForm(t, '/images/variations', { prompt: 'a red circle', size }, [['image', t.image]]), 400),
  async (t) => expect(await postForm(t, '/images/edits', { prompt: 'a red circle' }, [['image', new Blob([new Uint8Array(MAX_UPLOAD_BYTES + 1)])]]), 413),
  async (t) => expect(await post(t, '/images/edits', { prompt: 'a red circle', images: [{ image_url: 'https://example.com/a.png' }] }), 400),
];

/** GETs (and a HEAD) of a stored image's URL: whole, left unread, a range, a range past its end, revalidated; and of images that do not exist. */
async function file(i: number, target: SoakTarget, size: string): Promise<string> {
  if (!target.recent || Date.now() - target.recent.at > RECENT_MS) await images(target, await post(target, '/images/generations', generation(i, size, 1, { n: 1, response_format: 'url' })), 1);
  const url = target.recent!.url;
  const get = async (address: string, init: RequestInit, status: number) => {
    const res = await fetch(address, init);
    await res.arrayBuffer();
    if (res.status !== status) throw new Error(`${init.method ?? 'GET'} ${JSON.stringify(init.headers ?? {})} of an image answered ${res.status}, not ${status}`);
    return res;
  };
  switch (i % 8) {
    case 0:
      return String((await get(url, {}, 200)).status);
    case 7: {
      // The client leaves once the headers came, its body unread.
      const controller = new AbortController();
      const res = await fetch(url, { signal: controller.signal });
      controller.abort();
      if (res.status !== 200) throw new Error(`GET of an image answered ${res.status}`);
      return 'aborted';
    }
    case 1:
      return String((await get(url, { method: 'HEAD' }, 200)).status);
    case 2:
      return String((await get(url, { headers: { range: 'bytes=0-99' } }, 206)).status);
    case 3:
      return String((await get(url, { headers: { range: 'bytes=99999999-' } }, 416)).status);
    case 4: {
      const etag = (await get(url, { method: 'HEAD' }, 200)).headers.get('etag')!;
      return String((await get(url, { headers: { 'if-none-match': etag } }, 304)).status);
    }
    case 5:
      return String((await get(`${target.baseURL}/images/files/${'0'.repeat(32)}.png`, {}, 404)).status);
    default:
      return String((await get(`${target.baseURL}/images/files/not-an-image.gif`, {}, 404)).status);
  }
}

const PROBES: [string, number, boolean][] = [
  ['/health', 200, false],
  ['/ready', 200, false],
  ['/metrics', 200, true],
  ['/v1/models', 200, true],
  ['/v1/models/demo-shapes', 200, true],
  ['/v1/models/no-such-model', 404, true],
  ['/no-such-route', 404, false],
];

export const SOAK_PATHS: Record<string, SoakPath> = {
  url: { run: (i, t, size, steps) => generated(i, t, size, steps, 'url') },
  b64: { run: (i, t, size, steps) => generated(i, t, size, steps, 'b64_json') },
  stream: { run: (i, t, size, steps) => stream(i, t, size, steps) },
  // Leaves after the first bytes (`: queued`), the first event, or the third (a preview or an image).
  'stream-abort': { run: (i, t, size, steps) => stream(i, t, size, steps, [0, 1, 3][i % 3]) },
  edit: { run: (i, t, size, steps) => edit(i, t, size, steps) },
  'abort-url': { run: (i, t, size, steps) => abandoned((i * 7) % 200, (signal) => generated(i, t, size, steps, 'url', signal)) },
  'abort-b64': { run: (i, t, size, steps) => abandoned((i * 7) % 200, (signal) => generated(i, t, size, steps, 'b64_json', signal)) },
  'abort-edit': { run: (i, t, size, steps) => abandoned((i * 7) % 200, (signal) => edit(i, t, size, steps, signal)) },
  bad: { run: (i, t, size) => BAD[i % BAD.length](t, size) },
  unauthorized: {
    async run(i, t, size) {
      const keys = ['', 'sk-not-a-key'];
      if (i % 3 === 2) return expect(await postForm(t, '/images/edits', { prompt: 'a red circle', size }, [['image', t.image]], { key: keys[i % 2] }), 401);
      return expect(await post(t, '/images/generations', generation(i, size, 1), { key: keys[i % 2] }), 401);
    },
  },
  // One request a minute gets through (200); the others are the key's 429.
  'rate-limited': {
    async run(i, t, size) {
      if (i % 2) return expect(await postForm(t, '/images/edits', { prompt: 'a red circle', size, steps: 2, response_format: 'b64_json' }, [['image', t.image]], { key: t.limitedKey }), 200, 429);
      return expect(await post(t, '/images/generations', generation(i, size, 1, { response_format: 'b64_json' }), { key: t.limitedKey }), 200, 429);
    },
  },
  files: { run: (i, t, size) => file(i, t, size) },
  probes: {
    async run(i, t) {
      const [route, status, keyed] = PROBES[i % PROBES.length];
      const res = await fetch(`${t.origin}${route}`, { headers: keyed ? auth(t.key) : {} });
      await res.arrayBuffer();
      if (res.status !== status) throw new Error(`${route} answered ${res.status}`);
      return String(res.status);
    },
  },
  // 429 with QUEUE_MAX=0; 503 queue_timeout with a QUEUE_TIMEOUT_SECONDS of 1 and more clients than the workers serve in it.
  'queue-full': {
    needs: 'QUEUE_MAX=0 (a request that finds no worker free is refused), or QUEUE_TIMEOUT_SECONDS=1 and a --concurrency the workers cannot serve within it',
    async run(i, t, size, steps) {
      const format = i % 2 ? 'url' : 'b64_json';
      // Every third an edit, which a full queue refuses before its upload is read (the rest dropped as it comes).
      if (i % 3 === 2) return expect(await postForm(t, '/images/edits', { prompt: 'a red circle', size, steps, response_format: format }, [['image', t.image]]), 200, 429, 503);
      return expect(await post(t, '/images/generations', generation(i, size, steps, { response_format: format })), 200, 429, 503);
    },
  },
  'store-full': {
    // A url request reserves 192 KiB an image at 256x256 (3 bytes a pixel) until its images are stored, which
    // then count until they expire: a store of 1m refuses most while others run, and all once it holds
    // images of about 256 KiB, until they expire (the short IMAGE_TTL_SECONDS has the store sweep them as it fills).
    needs: 'MAX_STORE_BYTES=1m and IMAGE_TTL_SECONDS=2',
    run: async (i, t, size, steps) => expect(await post(t, '/images/generations', generation(i, size, steps, { response_format: 'url' })), 200, 507),
  },
};
