import { once } from 'node:events';
import http from 'node:http';
import { crc32, gzipSync } from 'node:zlib';
import OpenAI, { toFile, type Uploadable } from 'openai';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { imageReferenceBytes } from '../src/api/data-uri.js';
import { difference } from '../src/util/difference.js';
import { apiError } from './helpers/failures.js';
import { regionOf } from './helpers/pixel-region.js';
import { readImageFile } from './helpers/picture.js';
import { parseResponse, rawRequest } from './helpers/raw-http.js';
import { startRealServer, type RealServer } from './helpers/real-server.js';
import { referenceModel } from './helpers/reference.js';
import type { ErrorBody } from '../src/api/wire.js';

/**
 * Edits and variations end to end: a real server with real workers and the reference SD-Turbo model,
 * driven by the official SDK. The reference model knows the right answer: a red circle edited with
 * "a blue square" at strength 1 becomes one, at a low strength stays red; a mask confines the change.
 */

const KEY = 'sk-edits-0123456789';
/** The most an uploaded file may weigh: OpenAI takes gpt-image input images of less than 50 MB. */
const UPLOAD_LIMIT = 50 * 1024 ** 2;
const SIZE = 128;
let real: RealServer;
let client: OpenAI;
/** A red circle the API drew, as PNG bytes. */
let redCircle: Buffer;

beforeAll(async () => {
  const shapes = { copy: referenceModel('sd-turbo'), preset: { sizes: ['128x128', '256x128'], default_size: '128x128' } };
  // One image a batch: a request for n images runs n batches.
  const single = { copy: referenceModel('sd-turbo'), preset: { sizes: ['128x128'], default_size: '128x128', max_batch: 1 } };
  // An LCM: its scheduler takes at most 50 steps (its original_inference_steps).
  const lcm = { copy: referenceModel('lcm'), preset: { sizes: ['128x128'], default_size: '128x128' } };
  // A landscape and a portrait size of one area, the portrait the default, listed last or first: a square is as near to either.
  const oblong = (sizes: string[]) => ({ copy: referenceModel('sd-turbo'), preset: { sizes, default_size: '128x192' } });
  const models = { shapes, single, lcm, 'default-last': oblong(['192x128', '128x192']), 'default-first': oblong(['128x192', '192x128']) };
  real = await startRealServer({ apiKey: KEY, models, env: { DEFAULT_MODEL: 'shapes' } });
  client = real.client;
  const res = await client.images.generate({ model: 'shapes', prompt: 'a red circle', quality: 'hd', response_format: 'b64_json', seed: 1 } as OpenAI.ImageGenerateParamsNonStreaming);
  redCircle = Buffer.from(res.data![0].b64_json!, 'base64');
  expect((await readImageFile(redCircle)).reading).toMatchObject({ colour: 'red', shape: 'circle' });
}, 120_000);

afterAll(() => real?.close());

const png = (bytes: Buffer, name = 'in.png') => toFile(bytes, name, { type: 'image/png' });
const decoded = (data: OpenAI.ImagesResponse) => data.data!.map((d) => Buffer.from(d.b64_json!, 'base64'));

async function rgb(image: Buffer): Promise<Uint8Array> {
  return new Uint8Array(await sharp(image).removeAlpha().raw().toBuffer());
}

/** Mean absolute difference of two SIZE-wide pictures over the columns [from, to). */
async function columnsDifference(a: Buffer, b: Buffer, from: number, to: number): Promise<number> {
  const columns = async (image: Buffer) => regionOf(await rgb(image), SIZE, (x) => x >= from && x < to);
  return difference(await columns(a), await columns(b)).mean;
}

/** A SIZE x SIZE RGBA mask, opaque on the left half and fully transparent (edit here) on the right. */
function rightHalfMask(width = SIZE, height = SIZE): Promise<Buffer> {
  const pixels = Buffer.alloc(width * height * 4, 255);
  for (let p = 0; p < width * height; p++) if (p % width >= width / 2) pixels[p * 4 + 3] = 0;
  return sharp(pixels, { raw: { width, height, channels: 4 } }).png().toBuffer();
}

type ErrorClass = typeof OpenAI.BadRequestError;

async function expectApiError(call: Promise<unknown>, kind: ErrorClass, status: number, param: string | null, code: string | null): Promise<InstanceType<typeof OpenAI.APIError>> {
  const err = await apiError(call, kind);
  expect(err).toMatchObject({ status, param, code });
  return err;
}

/** A raw form post, for what the SDK will not send. */
async function postForm(route: string, form: FormData): Promise<{ status: number; error: ErrorBody['error'] }> {
  const res = await fetch(`${real.baseURL}/images/${route}`, { method: 'POST', headers: { authorization: `Bearer ${KEY}` }, body: form });
  return { status: res.status, error: ((await res.json()) as ErrorBody).error };
}

/**
 * A grey progressive JPEG of `side` x `side` whose every coefficient comes in its own scans, one per bit
 * of precision (704 scans): the progression JPEG allows at its longest, each scan a pass of the decoder
 * over every block. Its scans carry no data but end-of-band runs (one Huffman code each, DC and AC).
 */
function manyScanJpeg(side: number): Buffer {
  const segment = (marker: number, payload: number[]) => Buffer.from([0xff, marker, (payload.length + 2) >> 8, (payload.length + 2) & 0xff, ...payload]);
  const bits = (text: string) => {
    const padded = text.padEnd(Math.ceil(text.length / 8) * 8, '1');
    // A 0xFF byte of scan data is followed by a stuffed 0x00.
    return Buffer.from(Array.from({ length: padded.length / 8 }, (_, i) => Number.parseInt(padded.slice(i * 8, i * 8 + 8), 2)).flatMap((byte) => (byte === 0xff ? [byte, 0] : [byte])));
  };
  const blocks = (side / 8) ** 2;
  const lowestBit = 10;
  // DC: a difference of 0 a block (its code is the one bit 0), then a correction bit a block per refinement.
  const dc = bits('0'.repeat(blocks));
  // AC: end-of-band runs of 32767 blocks (code 0, then 14 one bits), for first scans and refinements alike.
  const ac = bits('0'.concat('1'.repeat(14)).repeat(Math.ceil(blocks / 32767)));
  const scan = (first: number, last: number, high: number, low: number, data: Buffer) => Buffer.concat([segment(0xda, [1, 1, 0x00, first, last, (high << 4) | low]), data]);
  const parts = [
    Buffer.from([0xff, 0xd8]),
    segment(0xdb, [0, ...new Array<number>(64).fill(1)]),
    segment(0xc2, [8, side >> 8, side & 0xff, side >> 8, side & 0xff, 1, 1, 0x11, 0]),
    segment(0xc4, [0x00, 1, ...new Array<number>(15).fill(0), 0x00]),
    segment(0xc4, [0x10, 1, ...new Array<number>(15).fill(0), 0xe0]),
  ];
  for (let k = 0; k < 64; k++) {
    const data = k === 0 ? dc : ac;
    parts.push(scan(k, k, 0, lowestBit, data));
    for (let bit = lowestBit; bit > 0; bit--) parts.push(scan(k, k, bit, bit - 1, data));
  }
  parts.push(Buffer.from([0xff, 0xd9]));
  return Buffer.concat(parts);
}

describe('POST /v1/images/edits', () => {
  it('at strength 1 draws the prompt: the red circle becomes a blue square', async () => {
    const res = await client.images.edit({ model: 'shapes', image: await png(redCircle), prompt: 'a blue square', response_format: 'b64_json', quality: 'high', strength: 1, seed: 5 } as OpenAI.ImageEditParamsNonStreaming);
    const [image] = decoded(res);
    const { info, reading } = await readImageFile(image);
    expect([info.width, info.height]).toEqual([SIZE, SIZE]);
    expect(reading).toMatchObject({ colour: 'blue', shape: 'square' });
  });

  it("without a size (or with 'auto'), runs at the model's size nearest the picture's shape: a landscape picture stays landscape", async () => {
    const shaped = async (width: number, height: number, size?: 'auto', model = 'shapes') => {
      const picture = await sharp(redCircle).resize(width, height, { fit: 'fill' }).png().toBuffer();
      const res = await client.images.edit({ model, image: await png(picture), prompt: 'a blue square', response_format: 'b64_json', seed: 5, ...(size && { size }) } as OpenAI.ImageEditParamsNonStreaming);
      const { width: w, height: h } = await sharp(decoded(res)[0]).metadata();
      return `${w}x${h}`;
    };
    // Before, every one was the default 128x128: a landscape photo lost its sides to the crop.
    expect(await shaped(512, 256)).toBe('256x128');
    expect(await shaped(300, 160, 'auto')).toBe('256x128');
    // The default where the picture is as near to it, or nearer: a square, a portrait (the model serves no portrait size).
    expect(await shaped(200, 200)).toBe('128x128');
    expect(await shaped(128, 256)).toBe('128x128');
    // Served sizes as near in shape and area: the default, not the first or the last served.
    expect([await shaped(200, 200, undefined, 'default-last'), await shaped(200, 200, undefined, 'default-first')]).toEqual(['128x192', '128x192']);
  });

  it("names what 'auto' would run at for this picture when a gpt-image edit asks for a size the model does not serve", async () => {
    const landscape = await sharp(redCircle).resize(512, 256, { fit: 'fill' }).png().toBuffer();
    const err = await expectApiError(client.images.edit({ model: 'gpt-image-2', image: await png(landscape), prompt: 'a blue square', size: '1024x1024' }), OpenAI.BadRequestError, 400, 'size', 'invalid_value');
    // Before, the model's default (128x128), which this edit would not have run at.
    expect(err.message).toMatch(/\('auto' is 256x128 for this picture, the served size nearest its shape\)/);
  });

  it('at a low strength keeps the red circle', async () => {
    const res = await client.images.edit({ model: 'shapes', image: await png(redCircle), prompt: 'a blue square', response_format: 'b64_json', quality: 'high', strength: 0.25, seed: 2 } as OpenAI.ImageEditParamsNonStreaming);
    expect((await readImageFile(decoded(res)[0])).reading).toMatchObject({ colour: 'red' });
  });

  it('with a mask whose right half is transparent changes only the right half', async () => {
    const res = await client.images.edit({
      model: 'shapes',
      image: await png(redCircle),
      mask: await png(await rightHalfMask(), 'mask.png'),
      prompt: 'a big green square',
      response_format: 'b64_json',
      quality: 'high',
      seed: 3,
    } as OpenAI.ImageEditParamsNonStreaming);
    const [image] = decoded(res);
    const [left, right] = [await columnsDifference(image, redCircle, 0, SIZE / 2 - 8), await columnsDifference(image, redCircle, SIZE / 2 + 8, SIZE)];
    expect(left).toBeLessThan(8);
    expect(right).toBeGreaterThan(4 * left + 10);
  });

  it("keeps a mask's half-transparent area, as at the model's size, when the picture is scaled to it (as a photo larger than the model's size is)", async () => {
    // Twice the model's size: the right half fully transparent, the second quarter at alpha 100 (a soft brush).
    const side = 2 * SIZE;
    const mask = (alphaAt: (x: number) => number) => {
      const pixels = Buffer.alloc(side * side * 4, 255);
      for (let p = 0; p < side * side; p++) pixels[p * 4 + 3] = alphaAt(p % side);
      return sharp(pixels, { raw: { width: side, height: side, channels: 4 } }).png().toBuffer();
    };
    const large = await sharp(redCircle).resize(side, side).png().toBuffer();
    const edit = async (alphaAt: (x: number) => number) =>
      client.images.edit({ model: 'shapes', image: await png(large), mask: await png(await mask(alphaAt), 'mask.png'), prompt: 'a big green square', response_format: 'b64_json', quality: 'high', seed: 3 } as OpenAI.ImageEditParamsNonStreaming);
    const [image] = decoded(await edit((x) => (x >= side / 2 ? 0 : x >= side / 4 ? 100 : 255)));
    const [soft, right] = [await columnsDifference(image, redCircle, SIZE / 4 + 8, SIZE / 2 - 8), await columnsDifference(image, redCircle, SIZE / 2 + 8, SIZE)];
    // Before, the half-transparent columns were repainted as the transparent ones were.
    expect(soft).toBeLessThan(8);
    expect(right).toBeGreaterThan(4 * soft + 10);
    // A mask only half-transparent marks nothing, scaled or not (OpenAI's masks edit where alpha is zero).
    const err = await expectApiError(edit((x) => (x >= side / 2 ? 100 : 255)), OpenAI.BadRequestError, 400, 'mask', 'invalid_mask');
    expect(err.message).toMatch(/no fully transparent pixel/);
  });

  it('without a mask, repaints where the image itself is fully transparent, at the strength of a masked edit', async () => {
    const image = await halfTransparent();
    const edit = async (strength?: number) => {
      const res = await client.images.edit({ model: 'shapes', image: await png(image), prompt: 'a big green square', response_format: 'b64_json', quality: 'high', seed: 3, ...(strength && { strength }) } as OpenAI.ImageEditParamsNonStreaming);
      return decoded(res)[0];
    };
    const [result, atOne, atEdits] = [await edit(), await edit(1), await edit(0.8)];
    const [left, right] = [await columnsDifference(result, image, 0, SIZE / 2 - 8), await columnsDifference(result, image, SIZE / 2 + 8, SIZE)];
    expect(left).toBeLessThan(8);
    expect(right).toBeGreaterThan(4 * left + 10);
    // Masked edits default to strength 1 (an edit of the whole picture to 0.8).
    expect(result.equals(atOne)).toBe(true);
    expect(result.equals(atEdits)).toBe(false);
  });

  it('streams progress over all of its batches out of the steps its strength runs, a total that never changes', async () => {
    const form = new FormData();
    for (const [name, value] of Object.entries({ model: 'single', prompt: 'a blue square', n: '2', steps: '8', strength: '0.5', stream: 'true', stream_progress: 'true' })) form.set(name, value);
    form.set('image', new Blob([new Uint8Array(redCircle)], { type: 'image/png' }), 'in.png');
    const res = await fetch(`${real.baseURL}/images/edits`, { method: 'POST', headers: { authorization: `Bearer ${KEY}` }, body: form });
    const events = (await res.text()).split('\n').filter((line) => line.startsWith('data: ')).map((line) => JSON.parse(line.slice(6)) as { type: string; step?: number; steps?: number });
    const steps = events.filter((e) => e.step !== undefined);
    // Two batches of 4 steps each (half of 8): the total is 8 from the first step event on.
    expect(new Set(steps.map((e) => e.steps))).toEqual(new Set([8]));
    expect(steps.at(-1)!.step).toBe(8);
    expect(events.filter((e) => e.type === 'image_edit.completed')).toHaveLength(2);
  });

  it('answers gpt-image names inline with usage counting the input image', async () => {
    const res = await client.images.edit({ model: 'gpt-image-1', image: await png(redCircle), prompt: 'a blue square', input_fidelity: 'low' });
    expect(res.data![0].b64_json).toBeTruthy();
    // The demo model's 128x128 default: 8 x 8 image tokens in and out.
    expect(res.usage).toMatchObject({ input_tokens_details: { image_tokens: 64 }, output_tokens: 64 });
  });

  it('answers an edit that names no model as OpenAI does, inline as a gpt-image model (DEFAULT_MODEL runs it)', async () => {
    const res = await client.images.edit({ image: await png(redCircle), prompt: 'a blue square' } as OpenAI.ImageEditParamsNonStreaming);
    expect(Object.keys(res.data![0]).sort()).toEqual(['b64_json', 'seed']);
    expect(res).toMatchObject({ output_format: 'png', quality: 'medium', usage: { input_tokens_details: { image_tokens: 64 } } });
    const { info } = await readImageFile(decoded(res)[0]);
    expect([info.width, info.height]).toEqual([128, 128]);
    // dall-e's quality values still read as dall-e-2's edit.
    const standard = await client.images.edit({ image: await png(redCircle), prompt: 'a blue square', quality: 'standard' } as OpenAI.ImageEditParamsNonStreaming);
    expect(Object.keys(standard).sort()).toEqual(['created', 'data']);
    expect(standard.data![0].url).toBeTruthy();
  });

  it('takes the JSON form with a data: URI, and fits the input to the requested size', async () => {
    const res = await client.post<OpenAI.ImagesResponse>('/images/edits', {
      body: { model: 'shapes', images: [{ image_url: `data:image/png;base64,${redCircle.toString('base64')}` }], prompt: 'a blue square', size: '256x128', strength: 1, quality: 'high', response_format: 'b64_json', seed: 5 },
    });
    const { info, reading } = await readImageFile(decoded(res)[0]);
    expect([info.width, info.height]).toEqual([256, 128]);
    expect(reading).toMatchObject({ colour: 'blue', shape: 'square' });
  });

  it("takes a form's text 'null', which openai-node says to send for a null it cannot put in a form, as the field omitted", async () => {
    const image = await png(redCircle);
    // The SDK types these fields as nullable, but refuses a null in a form and names the text to send instead.
    await expect(client.images.edit({ model: 'gpt-image-1', image, prompt: 'a blue square', n: null })).rejects.toThrow("to pass null in FormData, you must use the string 'null'");
    const nullable = ['n', 'size', 'quality', 'response_format', 'output_format', 'output_compression', 'background', 'input_fidelity', 'complexity', 'moderation', 'partial_images', 'stream', 'safety_identifier', 'frame_count', 'frame_duration_ms', 'svg'];
    // Before, a 400 for each: "Invalid type for 'n': expected an integer, but got the text 'null' instead".
    const res = await client.images.edit({
      model: 'gpt-image-1',
      image,
      prompt: 'a blue square',
      ...Object.fromEntries(nullable.map((field) => [field, 'null'])),
      // Not nullable in the SDK's types: the text itself, echoed as the safety identifier.
      user: 'null',
    } as unknown as OpenAI.ImageEditParamsNonStreaming);
    expect(res).toMatchObject({ output_format: 'png', quality: 'medium', size: '128x128', safety_identifier: 'null' });
    expect(decoded(res)).toHaveLength(1);
    // A variation's model 'null' is the one of a request naming none (DEFAULT_MODEL, answered as dall-e-2's).
    const variation = await client.images.createVariation({ model: 'null', image: await png(redCircle), n: 'null', size: 'null', response_format: 'null' } as unknown as OpenAI.ImageCreateVariationParams);
    expect(Object.keys(variation).sort()).toEqual(['created', 'data']);
    expect(variation.data).toHaveLength(1);
    expect(variation.data![0].url).toMatch(/\.png$/);
  });

  it("takes every field of OpenAI's JSON edit (its EditImageBodyJsonParam), moderation included, which its form lacks but is taken there too", async () => {
    const uri = (bytes: Buffer) => `data:image/png;base64,${bytes.toString('base64')}`;
    const res = await client.post<OpenAI.ImagesResponse>('/images/edits', {
      body: {
        model: 'gpt-image-1.5',
        images: [{ image_url: uri(redCircle) }],
        mask: { image_url: uri(await rightHalfMask()) },
        prompt: 'a big green square',
        n: 1,
        quality: 'low',
        input_fidelity: 'high',
        size: 'auto',
        user: 'user-1234',
        output_format: 'webp',
        output_compression: 80,
        moderation: 'low',
        background: 'opaque',
        stream: false,
        partial_images: 0,
      },
    });
    expect(res).toMatchObject({ output_format: 'webp', quality: 'low', background: 'opaque', size: '128x128' });
    expect((await sharp(decoded(res)[0]).metadata()).format).toBe('webp');
    const form = await client.images.edit({ model: 'gpt-image-1.5', image: await png(redCircle), prompt: 'a blue square', moderation: 'auto' } as OpenAI.ImageEditParamsNonStreaming);
    expect(form.data).toHaveLength(1);
  });
});

/** A SIZE x SIZE picture: opaque blue on the left half, fully transparent on the right (as a logo on a transparent background is). */
function halfTransparent(): Promise<Buffer> {
  const pixels = Buffer.alloc(SIZE * SIZE * 4);
  for (let p = 0; p < SIZE * SIZE; p++) if (p % SIZE < SIZE / 2) pixels.set([0, 0, 255, 255], p * 4);
  return sharp(pixels, { raw: { width: SIZE, height: SIZE, channels: 4 } }).png().toBuffer();
}

describe('POST /v1/images/variations', () => {
  it('varies the whole picture, transparent parts or not: transparency is no mask here', async () => {
    const image = await halfTransparent();
    const res = await client.images.createVariation({ model: 'shapes', image: await png(image), response_format: 'b64_json', seed: 7, strength: 1 } as OpenAI.ImageCreateVariationParams);
    expect(await columnsDifference(decoded(res)[0], image, 0, SIZE / 2)).toBeGreaterThan(20);
  });

  it('answers a variation that names no model as dall-e-2 does, with a URL', async () => {
    const res = await client.images.createVariation({ image: await png(redCircle) } as OpenAI.ImageCreateVariationParams);
    expect(Object.keys(res).sort()).toEqual(['created', 'data']);
    expect((await fetch(res.data![0].url!)).status).toBe(200);
  });

  it('gives n different images close to the input', async () => {
    const res = await client.images.createVariation({ model: 'shapes', image: await png(redCircle), n: 3, response_format: 'b64_json', seed: 7 } as OpenAI.ImageCreateVariationParams);
    const images = decoded(res);
    expect(images).toHaveLength(3);
    for (const image of images) expect((await readImageFile(image)).reading.colour).toBe('red');
    expect(new Set(images.map((i) => i.toString('base64'))).size).toBe(3);
  });
});

describe('edit errors', () => {
  const edit = async (params: Partial<OpenAI.ImageEditParamsNonStreaming> & Record<string, unknown>) =>
    client.images.edit({ model: 'shapes', image: await png(redCircle), prompt: 'a blue square', ...params } as OpenAI.ImageEditParamsNonStreaming);

  it('refuses a file that is not an image, naming the field', async () => {
    await expectApiError(edit({ image: await toFile(Buffer.from('just some text'), 'in.txt', { type: 'text/plain' }) }), OpenAI.BadRequestError, 400, 'image', 'invalid_image_format');
    const gif = await sharp({ create: { width: 8, height: 8, channels: 3, background: 'red' } }).gif().toBuffer();
    await expectApiError(edit({ image: await toFile(gif, 'in.gif') }), OpenAI.BadRequestError, 400, 'image', 'invalid_image_format');
  });

  it("refuses a Buffer passed as the image itself, which openai-node sends as one text field a byte (image[0], image[1], ...), with a 400 naming 'image' and toFile, not a 413", async () => {
    // fs.readFileSync('in.png') given as `image`: the SDK makes a field of each byte, thousands of them.
    for (const bytes of [redCircle, new Uint8Array(redCircle)]) {
      const err = await expectApiError(edit({ image: bytes as unknown as Uploadable }), OpenAI.BadRequestError, 400, 'image', 'invalid_type');
      expect(err.message).toContain('toFile(');
      // In a list (image: [bytes]), its fields are image[][0], image[][1], ...: before, a 413 for too many form parts.
      const listed = await expectApiError(edit({ image: [bytes as unknown as Uploadable] }), OpenAI.BadRequestError, 400, 'image', 'invalid_type');
      expect(listed.message).toContain("'image[][0]' is what openai-node sends for a Buffer or Uint8Array");
    }
    const mask = await expectApiError(edit({ mask: redCircle as unknown as Uploadable }), OpenAI.BadRequestError, 400, 'mask', 'invalid_type');
    expect(mask.message).toContain('toFile(');
    await expectApiError(client.images.createVariation({ model: 'shapes', image: redCircle as unknown as Uploadable }), OpenAI.BadRequestError, 400, 'image', 'invalid_type');
  });

  it('refuses an empty file, as image, as mask, in a variation and as an empty data URI', async () => {
    const empty = () => toFile(Buffer.alloc(0), 'empty.png', { type: 'image/png' });
    const err = await expectApiError(edit({ image: await empty() }), OpenAI.BadRequestError, 400, 'image', 'invalid_image_format');
    expect(err.message).toContain('the file is empty');
    await expectApiError(edit({ mask: await empty() }), OpenAI.BadRequestError, 400, 'mask', 'invalid_image_format');
    await expectApiError(client.images.createVariation({ model: 'shapes', image: await empty() }), OpenAI.BadRequestError, 400, 'image', 'invalid_image_format');
    const post = (imageUrl: string) => client.post('/images/edits', { body: { prompt: 'a blue square', images: [{ image_url: imageUrl }] } });
    await expectApiError(post('data:image/png;base64,'), OpenAI.BadRequestError, 400, 'images[0].image_url', 'invalid_image_format');
  });

  it('refuses a mask of another size, or without an alpha channel', async () => {
    await expectApiError(edit({ mask: await png(await rightHalfMask(64, 64), 'mask.png') }), OpenAI.BadRequestError, 400, 'mask', 'invalid_mask');
    const opaque = await sharp({ create: { width: SIZE, height: SIZE, channels: 3, background: 'white' } }).png().toBuffer();
    const err = await expectApiError(edit({ mask: await png(opaque, 'mask.png') }), OpenAI.BadRequestError, 400, 'mask', 'invalid_mask');
    expect(err.message).toContain('alpha channel');
  });

  it("refuses a mask whose transparent stroke falls between the pixels the model reads its mask at, and takes the same stroke on them", async () => {
    // A stroke 4 pixels wide, down the whole picture: the latent mask reads one pixel per 8x8 block,
    // its top-left, so at columns 3 to 6 the edit would repaint nothing; at 8 to 11 it repaints.
    const stroke = (from: number) => {
      const pixels = Buffer.alloc(SIZE * SIZE * 4, 255);
      for (let p = 0; p < SIZE * SIZE; p++) if (p % SIZE >= from && p % SIZE < from + 4) pixels[p * 4 + 3] = 0;
      return sharp(pixels, { raw: { width: SIZE, height: SIZE, channels: 4 } }).png().toBuffer();
    };
    const err = await expectApiError(edit({ mask: await png(await stroke(3), 'mask.png'), steps: 1 }), OpenAI.BadRequestError, 400, 'mask', 'invalid_mask');
    expect(err.message).toMatch(/too thin: the model repaints the picture in 8x8 blocks.*no block's top-left pixel is transparent.*at least 8 pixels wide and tall/);
    const res = await edit({ mask: await png(await stroke(8), 'mask.png'), steps: 1, response_format: 'b64_json' });
    expect(res.data).toHaveLength(1);
  });

  it('refuses more than one image, naming the limit', async () => {
    const err = await expectApiError(edit({ image: [await png(redCircle), await png(redCircle)] }), OpenAI.BadRequestError, 400, 'image', 'too_many_images');
    expect(err.message).toContain('one image per request');
  });

  it('refuses a second image as it begins, unread: the answer comes while the client is still sending it', async () => {
    const boundary = 'edits-test-boundary';
    const head = (name: string, file?: string) =>
      `--${boundary}\r\nContent-Disposition: form-data; name="${name}"${file ? `; filename="${file}"\r\nContent-Type: image/png` : ''}\r\n\r\n`;
    const { hostname, port } = new URL(real.baseURL);
    const request = http.request({ host: hostname, port, path: '/v1/images/edits', method: 'POST', headers: { authorization: `Bearer ${KEY}`, 'content-type': `multipart/form-data; boundary=${boundary}` } });
    try {
      const response = once(request, 'response') as Promise<[http.IncomingMessage]>;
      request.write(`${head('prompt')}a blue square\r\n`);
      request.write(Buffer.concat([Buffer.from(head('image[]', 'a.png')), redCircle, Buffer.from('\r\n')]));
      // The second image's first bytes, and never its end: a large upload still on its way.
      request.write(Buffer.concat([Buffer.from(head('image[]', 'b.png')), Buffer.alloc(64 * 1024)]));
      const [res] = await response;
      const chunks: Buffer[] = [];
      for await (const chunk of res) chunks.push(chunk as Buffer);
      expect(res.statusCode).toBe(400);
      expect(JSON.parse(Buffer.concat(chunks).toString()).error).toMatchObject({ param: 'image', code: 'too_many_images' });
    } finally {
      request.destroy();
    }
  });

  it('refuses a form part without a name', async () => {
    const boundary = 'edits-test-boundary';
    const body = `--${boundary}\r\nContent-Disposition: form-data; name="prompt"\r\n\r\nx\r\n--${boundary}\r\nContent-Disposition: form-data\r\n\r\nnameless\r\n--${boundary}--\r\n`;
    const res = await fetch(`${real.baseURL}/images/edits`, { method: 'POST', headers: { authorization: `Bearer ${KEY}`, 'content-type': `multipart/form-data; boundary=${boundary}` }, body });
    expect(res.status).toBe(400);
    expect(((await res.json()) as ErrorBody).error).toMatchObject({ code: 'invalid_multipart', param: null, message: expect.stringContaining('has no name') });
  });

  it('refuses a text field or a mask sent twice in a form, naming it, rather than keep one of them', async () => {
    const picture = () => new Blob([new Uint8Array(redCircle)], { type: 'image/png' });
    const form = (twice: 'prompt' | 'mask') => {
      const body = new FormData();
      body.set('image', picture(), 'in.png');
      body.append('prompt', 'a blue square');
      if (twice === 'prompt') body.append('prompt', 'a red circle');
      else for (let i = 0; i < 2; i++) body.append('mask', picture(), 'mask.png');
      return body;
    };
    for (const twice of ['prompt', 'mask'] as const) {
      const { status, error } = await postForm('edits', form(twice));
      expect({ status, param: error.param, code: error.code }).toEqual({ status: 400, param: twice, code: 'invalid_value' });
      expect(error.message).toContain('more than once');
    }
  });

  it("takes a file input left empty in an HTML form (filename=\"\", no bytes) as omitted: no mask, or no image", async () => {
    const boundary = 'edits-test-boundary';
    const field = (name: string, value: string) => `--${boundary}\r\nContent-Disposition: form-data; name="${name}"\r\n\r\n${value}\r\n`;
    const file = (name: string, filename: string, bytes: Buffer) =>
      Buffer.concat([Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="${name}"; filename="${filename}"\r\nContent-Type: application/octet-stream\r\n\r\n`), bytes, Buffer.from('\r\n')]);
    const send = (...parts: (string | Buffer)[]) =>
      fetch(`${real.baseURL}/images/edits`, {
        method: 'POST',
        headers: { authorization: `Bearer ${KEY}`, 'content-type': `multipart/form-data; boundary=${boundary}` },
        body: Buffer.concat([...parts.map((p) => Buffer.from(p)), Buffer.from(`--${boundary}--\r\n`)]),
      });
    const noMask = await send(field('prompt', 'a blue square'), field('steps', '2'), field('response_format', 'b64_json'), file('image', 'in.png', redCircle), file('mask', '', Buffer.alloc(0)));
    expect(noMask.status).toBe(200);
    expect(((await noMask.json()) as { data: unknown[] }).data).toHaveLength(1);
    const noImage = await send(field('prompt', 'a blue square'), file('image', '', Buffer.alloc(0)));
    expect(noImage.status).toBe(400);
    expect(((await noImage.json()) as ErrorBody).error).toMatchObject({ param: 'image', code: 'missing_required_parameter' });
  });

  it('refuses a request without an image', async () => {
    const form = new FormData();
    form.set('prompt', 'a blue square');
    expect(await postForm('edits', form)).toMatchObject({ status: 400, error: { param: 'image', code: 'missing_required_parameter' } });
  });

  it('refuses an image too large in pixels, also one beyond what the decoder reads the header of', async () => {
    const wide = await sharp({ create: { width: 5000, height: 4, channels: 3, background: 'red' } }).png().toBuffer();
    await expectApiError(edit({ image: await png(wide) }), OpenAI.BadRequestError, 400, 'image', 'image_too_large');
    // A small PNG whose header says 30000x30000 (its IHDR patched, the checksum mended).
    const huge = Buffer.from(await sharp({ create: { width: 8, height: 8, channels: 3, background: 'red' } }).png().toBuffer());
    huge.writeUInt32BE(30000, 16);
    huge.writeUInt32BE(30000, 20);
    huge.writeUInt32BE(crc32(huge.subarray(12, 29)), 29);
    await expectApiError(edit({ image: await png(huge) }), OpenAI.BadRequestError, 400, 'image', 'image_too_large');
  });

  it('refuses a JPEG of more scans than encoders write (each costs the decoder a pass over the picture), and takes an ordinary progressive one', async () => {
    const bomb = manyScanJpeg(1024);
    const err = await expectApiError(edit({ image: await toFile(bomb, 'photo.jpg', { type: 'image/jpeg' }) }), OpenAI.BadRequestError, 400, 'image', 'invalid_image_format');
    expect(err.message).toContain("Invalid file 'image': the JPEG is stored in more than 100 scans");
    // What it is: a JPEG sharp reads the header of, progressive, 1024 pixels a side.
    expect(await sharp(bomb).metadata()).toMatchObject({ format: 'jpeg', width: 1024, height: 1024, isProgressive: true });
    const progressive = await sharp(redCircle).jpeg({ progressive: true }).toBuffer();
    // The settings of the first test, which draw the square whatever the picture (a random seed may not).
    const res = await edit({ image: await toFile(progressive, 'photo.jpg', { type: 'image/jpeg' }), response_format: 'b64_json', size: '128x128', quality: 'high', strength: 1, seed: 5 });
    expect((await readImageFile(decoded(res)[0])).reading.shape).toBe('square');
  });

  it('refuses unknown and malformed fields, and a strength that leaves no step', async () => {
    await expectApiError(edit({ foo: 'bar' }), OpenAI.BadRequestError, 400, 'foo', 'unknown_parameter');
    // A form's values are all text: its 400 names the text sent and how to write the value, not "got a string".
    const word = await expectApiError(edit({ n: 'many' as unknown as number }), OpenAI.BadRequestError, 400, 'n', 'invalid_type');
    expect(word.message).toMatch(/Invalid type for 'n': expected an integer, but got the text 'many' instead \(a multipart form sends it as digits only, e\.g\. 2\)\.$/);
    const yes = await expectApiError(edit({ stream: 'yes' as unknown as false }), OpenAI.BadRequestError, 400, 'stream', 'invalid_type');
    expect(yes.message).toMatch(/expected a boolean, but got the text 'yes' instead \(a multipart form sends it as true or false\)/);
    // A long text is quoted cut at 40 characters, not amid an emoji's two UTF-16 halves (a lone surrogate no client shows).
    const emoji = await expectApiError(edit({ n: `a${'🎨'.repeat(50)}` as unknown as number }), OpenAI.BadRequestError, 400, 'n', 'invalid_type');
    expect(emoji.message).toContain(`the text 'a${'🎨'.repeat(39)}...' instead`);
    await expectApiError(edit({ stream: true, response_format: 'url' } as Record<string, unknown>), OpenAI.BadRequestError, 400, 'response_format', 'unsupported_value');
    await expectApiError(edit({ strength: 0.1, steps: 4 }), OpenAI.BadRequestError, 400, 'strength', 'invalid_value');
    // A strength so low that it leaves the model's scheduler fewer steps than the preset's: the strength is named
    // (the LCM model's own pipeline picks its steps among the distilled timesteps the strength leaves: none of 50 at 0.01).
    const low = await expectApiError(edit({ model: 'lcm', strength: 0.01 }), OpenAI.BadRequestError, 400, 'strength', 'invalid_value');
    expect(low.message).toMatch(/steps must be between 1 and 0, the distilled timesteps strength 0\.01 leaves of original_inference_steps \(50\)\. Raise 'strength'\.$/);
    // More steps than those it leaves (int(50 x 0.1) = 5): the steps are named.
    const many = await expectApiError(edit({ model: 'lcm', steps: 6, strength: 0.1 }), OpenAI.BadRequestError, 400, 'steps', 'invalid_value');
    expect(many.message).toMatch(/steps must be between 1 and 5/);
    // LCMScheduler on a model of another pipeline slices its steps as the Stable Diffusion pipelines do: the
    // steps a strength of 0.01 needs are more than it takes.
    const sliced = await expectApiError(edit({ model: 'shapes', scheduler: 'lcm', strength: 0.01 }), OpenAI.BadRequestError, 400, 'strength', 'invalid_value');
    expect(sliced.message).toMatch(/runs one step only of 100 or more\)\. Raise 'strength'\.$/);
    await expectApiError(edit({ prompt: '' }), OpenAI.BadRequestError, 400, 'prompt', 'empty_string');
    // dall-e-2's limit, as OpenAI's edits endpoint holds it to (the SDK documents 1000 characters there).
    await expectApiError(edit({ model: 'dall-e-2', prompt: 'a'.repeat(1001) }), OpenAI.BadRequestError, 400, 'prompt', 'string_above_max_length');
  });

  it("takes a form's boolean in any case: Python's requests sends True as 'True'", async () => {
    const form = new FormData();
    form.set('image', new Blob([new Uint8Array(redCircle)]), 'in.png');
    for (const [key, value] of Object.entries({ model: 'shapes', prompt: 'a blue square', stream: 'True', seed: '5' })) form.set(key, value);
    const res = await fetch(`${real.baseURL}/images/edits`, { method: 'POST', headers: { authorization: `Bearer ${KEY}` }, body: form });
    // Before, a 400 "expected a boolean, but got a string".
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toMatch(/^text\/event-stream/);
    expect(await res.text()).toMatch(/^event: image_edit\.completed$/m);
  });

  it("refuses openai-node 7's markup overlay by name, as a file and as a JSON field, saying to use a mask", async () => {
    const asFile = await expectApiError(edit({ markup: await png(redCircle, 'markup.png') }), OpenAI.BadRequestError, 400, 'markup', 'unsupported_parameter');
    expect(asFile.message).toContain("Make the area to redraw fully transparent in 'mask' instead.");
    const json = await fetch(`${real.baseURL}/images/edits`, {
      method: 'POST',
      headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'shapes', prompt: 'a blue square', images: [{ image_url: `data:image/png;base64,${redCircle.toString('base64')}` }], markup: { image_url: 'data:image/png;base64,' } }),
    });
    expect(json.status).toBe(400);
    expect(((await json.json()) as ErrorBody).error).toMatchObject({ param: 'markup', code: 'unsupported_parameter' });
  });

  it("refuses openai-node 7's SVG settings in an edit's form by name, as the SDK nests them (svg[model])", async () => {
    const err = await expectApiError(edit({ svg: { model: 'x', reasoning: { effort: 'low' } } }), OpenAI.BadRequestError, 400, 'svg', 'unsupported_parameter');
    expect(err.message).toContain("Unsupported parameter: 'svg' goes with output_format 'svg'");
  });

  it("runs every step of an LCM model's edit, as its own diffusers pipeline does (LatentConsistencyModelImg2ImgPipeline), not the share of them a strength leaves other pipelines", async () => {
    const totals = async (scheduler?: string) => {
      const stream = await client.images.edit({ model: 'lcm', image: await png(redCircle), prompt: 'a blue square', steps: 4, strength: 0.5, stream: true, stream_progress: true, ...(scheduler && { scheduler }) } as unknown as OpenAI.ImageEditParamsStreaming);
      const steps = new Set<number>();
      for await (const event of stream as AsyncIterable<{ type: string; steps?: number }>) if (event.type === 'imagegen.progress' && event.steps) steps.add(event.steps);
      return [...steps];
    };
    expect(await totals()).toEqual([4]);
    // With Euler, the Stable Diffusion pipeline's rule: floor(4 x 0.5) of the 4 steps.
    expect(await totals('euler')).toEqual([2]);
  });

  it('refuses URLs and file ids in the JSON form: the server fetches nothing', async () => {
    const post = (body: Record<string, unknown>) => client.post('/images/edits', { body: { prompt: 'a blue square', ...body } });
    const err = await expectApiError(post({ images: [{ image_url: 'https://example.com/a.png' }] }), OpenAI.BadRequestError, 400, 'images[0].image_url', 'unsupported_value');
    expect(err.message).toContain('does not fetch URLs');
    await expectApiError(post({ images: [{ file_id: 'file-123' }] }), OpenAI.BadRequestError, 400, 'images[0].file_id', 'unsupported_value');
    // The form's 'image' sent in JSON is unknown there, and the answer says what JSON takes.
    const single = await expectApiError(post({ image: `data:image/png;base64,${redCircle.toString('base64')}` }), OpenAI.BadRequestError, 400, 'image', 'unknown_parameter');
    expect(single.message).toMatch(/Unknown parameter: 'image'\. A JSON edit sends its picture as 'images': \[\{"image_url": /);
    await expectApiError(post({ images: [{ image_url: 'data:image/png;base64,aGVsbG8=' }] }), OpenAI.BadRequestError, 400, 'images[0].image_url', 'invalid_image_format');
    // The scheme and the base64 marker in any case, as URI schemes are case-insensitive.
    expect(imageReferenceBytes({ image_url: 'DATA:image/png;BASE64,aGVsbG8=' }, 'images[0]').toString()).toBe('hello');
    // Binary data percent-encoded byte by byte (RFC 2397's other form), which is not UTF-8 text.
    const percentEncoded = `data:image/png,${[...redCircle].map((byte) => `%${byte.toString(16).padStart(2, '0')}`).join('')}`;
    expect(imageReferenceBytes({ image_url: percentEncoded }, 'images[0]')).toEqual(redCircle);
    expect(imageReferenceBytes({ image_url: 'data:,a%20b%FFc' }, 'images[0]')).toEqual(Buffer.from([0x61, 0x20, 0x62, 0xff, 0x63]));
    // base64 wrapped in lines, as tools write it (76 columns: `base64` without -w0, MIME), and in the URL-safe alphabet.
    const wrapped = redCircle.toString('base64').replace(/.{76}/g, '$&\r\n');
    expect(imageReferenceBytes({ image_url: `data:image/png;base64,${wrapped}` }, 'images[0]')).toEqual(redCircle);
    expect(imageReferenceBytes({ image_url: `data:image/png;base64,${redCircle.toString('base64url')}` }, 'images[0]')).toEqual(redCircle);
    for (const [imageUrl, why] of [['data:image/png,%89PNG%', 'percent-encoding'], ['data:image/png,%zz', 'percent-encoding'], ['data:image/png;base64,!!!!', 'base64']]) {
      const bad = await expectApiError(post({ images: [{ image_url: imageUrl }] }), OpenAI.BadRequestError, 400, 'images[0].image_url', 'invalid_value');
      expect(bad.message).toContain(`not valid ${why}`);
    }
    await expectApiError(post({ images: [{ image_url: 'data:image/png,%89PNG' }] }), OpenAI.BadRequestError, 400, 'images[0].image_url', 'invalid_image_format');
    await expectApiError(post({}), OpenAI.BadRequestError, 400, 'images', 'missing_required_parameter');
    const none = await expectApiError(post({ images: [] }), OpenAI.BadRequestError, 400, 'images', 'empty_array');
    expect(none.message).toContain("Invalid 'images': empty array. Expected an array with minimum length 1");
    await expectApiError(post({ images: [{}] }), OpenAI.BadRequestError, 400, 'images[0].image_url', 'missing_required_parameter');
    const wrongType = await expectApiError(post({ images: [{ image_url: { url: 'data:,' } }] }), OpenAI.BadRequestError, 400, 'images[0].image_url', 'invalid_type');
    expect(wrongType.message).toContain('expected a string');
  });

  it('answers 413 for a file over the upload limit and a JSON body over BODY_LIMIT', async () => {
    const form = new FormData();
    form.set('prompt', 'a blue square');
    form.set('image', new Blob([new Uint8Array(UPLOAD_LIMIT + 1)]), 'big.png');
    const tooLarge = await postForm('edits', form);
    expect(tooLarge).toMatchObject({ status: 413, error: { code: 'request_too_large', param: 'image' } });
    expect(tooLarge.error.message).toBe("An uploaded file ('image') is too large: the limit is 50 MiB per file. Send a smaller image.");
    const big = `data:image/png;base64,${Buffer.alloc(2 * 1024 ** 2).toString('base64')}`;
    const overLimit = await expectApiError(client.post('/images/edits', { body: { prompt: 'x', images: [{ image_url: big }] } }), OpenAI.APIError, 413, null, 'request_too_large');
    // A JSON edit that large is a picture as a data: URI: the answer says how to send it instead.
    expect(overLimit.message).toMatch(/multipart\/form-data upload .* 50 MiB .* BODY_LIMIT/);
    // The same when it is counted as it is decompressed (a gzip body small on the wire).
    const gzipped = await fetch(`${real.baseURL}/images/edits`, {
      method: 'POST',
      headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json', 'content-encoding': 'gzip' },
      body: gzipSync(JSON.stringify({ prompt: 'x', images: [{ image_url: big }] })),
    });
    expect(gzipped.status).toBe(413);
    expect(((await gzipped.json()) as ErrorBody).error.message).toMatch(/after decompression\. .*multipart\/form-data upload .* BODY_LIMIT/);
    // A generation takes no form and no picture: its answer offers neither.
    const generation = await expectApiError(client.post('/images/generations', { body: { prompt: 'x'.repeat(2 * 1024 ** 2) } }), OpenAI.APIError, 413, null, 'request_too_large');
    expect(generation.message).toMatch(/The request body is too large: the limit is 1048576 bytes\.$/);
  });

  it('takes a file of exactly the upload limit: OpenAI takes gpt-image input images of up to 50 MB', async () => {
    // The red circle with a private chunk (which decoders skip) filling it out to the limit to the byte.
    const padding = UPLOAD_LIMIT - redCircle.length - 12;
    const chunk = Buffer.alloc(12 + padding);
    chunk.writeUInt32BE(padding, 0);
    chunk.write('prVt', 4, 'latin1');
    chunk.writeUInt32BE(crc32(chunk.subarray(4, 8 + padding)), 8 + padding);
    const iend = redCircle.length - 12;
    const file = Buffer.concat([redCircle.subarray(0, iend), chunk, redCircle.subarray(iend)]);
    expect(file.length).toBe(UPLOAD_LIMIT);
    const res = await client.images.edit({ model: 'shapes', image: await png(file), prompt: 'a blue square', response_format: 'b64_json' });
    expect(await sharp(decoded(res)[0]).metadata()).toMatchObject({ width: SIZE, height: SIZE });
  });

  it("names the file over the upload limit also when the bytes read so far end exactly at the limit", async () => {
    // The file's first 50 MiB arrive and are read; the next chunk, past the limit, adds none of its
    // bytes to the file: the parser's reading of the file ended without an error, and the form's
    // error came later, naming no file (param null).
    const boundary = 'b0undary';
    const head = `--${boundary}\r\nContent-Disposition: form-data; name="prompt"\r\n\r\na blue square\r\n--${boundary}\r\nContent-Disposition: form-data; name="image"; filename="big.png"\r\nContent-Type: image/png\r\n\r\n`;
    const rest = Buffer.concat([Buffer.alloc(16), Buffer.from(`\r\n--${boundary}\r\nContent-Disposition: form-data; name="n"\r\n\r\n1\r\n--${boundary}--\r\n`)]);
    const request = [
      'POST /v1/images/edits HTTP/1.1',
      'Host: 127.0.0.1',
      `Authorization: Bearer ${KEY}`,
      `Content-Type: multipart/form-data; boundary=${boundary}`,
      `Content-Length: ${Buffer.byteLength(head) + UPLOAD_LIMIT + rest.length}`,
      '',
      head,
    ].join('\r\n');
    const exchange = rawRequest(Number(new URL(real.server.url).port), request);
    exchange.socket.write(Buffer.alloc(UPLOAD_LIMIT));
    // Until the server has read all of the limit, and is waiting for more.
    await new Promise((resolve) => setTimeout(resolve, 500));
    exchange.socket.write(rest);
    await expect.poll(() => exchange.text.includes('\r\n\r\n{'), { timeout: 10_000 }).toBe(true);
    exchange.socket.destroy();
    const { status, body } = parseResponse(exchange.text);
    expect(status).toBe('HTTP/1.1 413 Payload Too Large');
    expect(JSON.parse(body).error).toMatchObject({ code: 'request_too_large', param: 'image' });
  });
});

describe('variation errors', () => {
  it('refuses fields variations do not take, and a JSON body', async () => {
    const image = await png(redCircle);
    await expectApiError(client.images.createVariation({ image, prompt: 'a blue square' } as OpenAI.ImageCreateVariationParams), OpenAI.BadRequestError, 400, 'prompt', 'unknown_parameter');
    await expectApiError(client.images.createVariation({ image, mask: await png(redCircle) } as OpenAI.ImageCreateVariationParams), OpenAI.BadRequestError, 400, 'mask', 'unknown_parameter');
    await expectApiError(client.post('/images/variations', { body: { n: 1 } }), OpenAI.APIError, 415, null, 'unsupported_media_type');
  });

  it('refuses a size the model does not serve', async () => {
    await expectApiError(client.images.createVariation({ model: 'shapes', image: await png(redCircle), size: '1024x1024' }), OpenAI.BadRequestError, 400, 'size', 'invalid_value');
  });
});
