import { text } from 'node:stream/consumers';
import { describe, expect, it } from 'vitest';
import type { ImagesResponse } from '../src/api/wire.js';
import { imagesJson } from '../src/http/json-pieces.js';

/** The streamed JSON of an images answer is the answer: whatever its fields, however long its base64. */

const big = Buffer.alloc(3 * 1024 * 1024 + 5, 7).toString('base64');
const usage = { input_tokens: 3, input_tokens_details: { text_tokens: 3, image_tokens: 0 }, output_tokens: 4096, output_tokens_details: { text_tokens: 0, image_tokens: 4096 }, total_tokens: 4099 };

describe('an images answer as JSON pieces', () => {
  const cases: [string, ImagesResponse][] = [
    ['no images', { created: 1, data: [] }],
    ['urls', { created: 1, data: [{ url: 'http://127.0.0.1:8000/v1/images/files/a.png', seed: 1 }] }],
    ['b64 images, one over several slices', { created: 2, data: [{ b64_json: 'aGk=', seed: 3 }, { b64_json: big, seed: 4 }] }],
    ['gpt-image fields and usage', { created: 3, data: [{ b64_json: big, seed: 5 }], background: 'opaque', output_format: 'png', quality: 'medium', size: '1024x1024', usage }],
  ];
  for (const [name, response] of cases) {
    it(`${name}: parses back to the answer`, async () => {
      expect(JSON.parse(await text(imagesJson(response)))).toEqual(response);
    });
  }

  it('sends the base64 in pieces of at most 1 MiB, so the event loop turns between them', async () => {
    const sizes: number[] = [];
    for await (const piece of imagesJson({ created: 1, data: [{ b64_json: big, seed: 1 }] })) sizes.push((piece as Buffer | string).length);
    expect(sizes.length).toBeGreaterThan(4);
    expect(Math.max(...sizes)).toBeLessThanOrEqual(1 << 20);
  });
});
