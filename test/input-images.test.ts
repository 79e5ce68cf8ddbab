import { existsSync } from 'node:fs';
import { readFile, rm } from 'node:fs/promises';
import sharp from 'sharp';
import { describe, expect, it } from 'vitest';
import { parseImageRequest } from '../src/api/wire.js';
import type { ApiError } from '../src/api/errors.js';
import { createImageService } from '../src/service/images.js';
import { checkMask, decodeInputImage, editMarks, fitEdit } from '../src/service/input-images.js';
import { startTestServer } from './helpers/api-server.js';
import { failureOf } from './helpers/failures.js';
import { auth, makeRoot, MODEL, rootEnv, untilReady } from './helpers/ops-server.js';
import { spawnServer } from './helpers/server-process.js';

/**
 * An uploaded picture is checked at once but held as its file while its request waits: decoded at its
 * own size, each 4096 x 4096 upload held 64 MiB (and its mask as much) for as long as it queued, so a few
 * tiny uploads (a flat 4096 x 4096 PNG is a few hundred KiB) took gigabytes.
 */

const SIDE = 4096;

/** A flat SIDE x SIDE RGBA PNG: fully transparent on the left half, opaque blue on the right. */
function bigFlatPng(): Promise<Buffer> {
  return sharp({ create: { width: SIDE / 2, height: SIDE, channels: 4, background: { r: 0, g: 0, b: 255, alpha: 1 } } })
    .extend({ left: SIDE / 2, background: { r: 0, g: 0, b: 0, alpha: 0 } })
    .png()
    .toBuffer();
}

describe('uploaded pictures', () => {
  it('are held as their files, not decoded, while their requests wait', async () => {
    const file = await bigFlatPng();
    expect(file.length).toBeLessThan(1024 ** 2);
    const before = process.memoryUsage().external;
    const held = [];
    for (let i = 0; i < 10; i++) held.push(await decodeInputImage(Buffer.from(file), 'image'));
    // Ten decoded at their size would hold 640 MiB; as files, ten copies of the upload. (The check
    // decodes one channel for a moment: what it leaves to the collector is not held. sharp's buffers
    // are freed by finalizers that run after a collection, on later turns of the event loop: on a busy
    // machine one turn after one collection was not always enough, so a few are given.)
    const bound = 10 * file.length + 16 * 1024 ** 2;
    for (let turn = 0; turn < 10 && process.memoryUsage().external - before >= bound; turn++) {
      globalThis.gc!();
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    expect(process.memoryUsage().external - before).toBeLessThan(bound);
    expect(held[0]).toMatchObject({ width: SIDE, height: SIDE, hasAlpha: true, hasTransparentPixel: true, format: 'png' });
  });

  it('are decoded as they are fitted: upright, covering the size, their transparent pixels the mask', async () => {
    const image = await decodeInputImage(await bigFlatPng(), 'image');
    const { image: fitted, mask } = await fitEdit({ image, mask: editMarks({ image }) }, 256, 128, 8);
    expect([fitted.width, fitted.height, fitted.pixels.length]).toEqual([256, 128, 256 * 128 * 3]);
    // Covering 256x128 crops the square's top and bottom: the left half stays transparent, the right blue.
    expect([mask![10], mask![250]]).toEqual([255, 0]);
    expect([...fitted.pixels.subarray(250 * 3, 250 * 3 + 3)]).toEqual([0, 0, 255]);
  });

  it('keeps the stored colour of fully transparent pixels when it scales a picture, as at its own size (and as diffusers does)', async () => {
    // Left half opaque blue, right half transparent with red stored under it (as an editor's eraser may leave it).
    const rgba = Buffer.alloc(64 * 64 * 4);
    for (let p = 0; p < 64 * 64; p++) rgba.set(p % 64 < 32 ? [0, 0, 255, 255] : [255, 0, 0, 0], p * 4);
    const image = await decodeInputImage(await sharp(rgba, { raw: { width: 64, height: 64, channels: 4 } }).png().toBuffer(), 'image');
    for (const side of [64, 128]) {
      const { image: fitted, mask } = await fitEdit({ image, mask: editMarks({ image }) }, side, side, 8);
      const at = (x: number) => [...fitted.pixels.subarray((side * (side / 2) + x) * 3, (side * (side / 2) + x) * 3 + 3)];
      // Before, scaled, the right half was black: sharp resized it premultiplied by its alpha of 0.
      expect([at(side - 4), at(4)]).toEqual([[255, 0, 0], [0, 0, 255]]);
      expect([mask![side * (side / 2) + side - 4], mask![side * (side / 2) + 4]]).toEqual([255, 0]);
    }
  });

  it("repaints a mask's fully transparent pixels (a soft edge is kept, as OpenAI keeps it), at its own size and scaled alike", async () => {
    // Four columns of alpha 0, 60, 102 and 255 (a soft brush's edge between painted and kept).
    const alphas = [0, 60, 102, 255];
    const rgba = Buffer.alloc(64 * 64 * 4);
    for (let p = 0; p < 64 * 64; p++) rgba.set([255, 255, 255, alphas[Math.floor((p % 64) / 16)]], p * 4);
    const mask = await decodeInputImage(await sharp(rgba, { raw: { width: 64, height: 64, channels: 4 } }).png().toBuffer(), 'mask');
    const image = await decodeInputImage(await sharp({ create: { width: 64, height: 64, channels: 3, background: 'red' } }).png().toBuffer(), 'image');
    const columns = (repaint: Uint8Array, side: number) => [0, 1, 2, 3].map((c) => repaint[Math.floor(side / 2) * side + Math.floor(((c + 0.5) * side) / 4)]);
    expect(columns((await fitEdit({ image, mask }, 64, 64, 8)).mask!, 64)).toEqual([255, 0, 0, 0]);
    // Before, scaled, the alpha itself was cut at half: the columns of alpha 60 and 102 were repainted too.
    expect(columns((await fitEdit({ image, mask }, 128, 128, 8)).mask!, 128)).toEqual([255, 0, 0, 0]);
    expect(columns((await fitEdit({ image, mask }, 32, 32, 8)).mask!, 32)).toEqual([255, 0, 0, 0]);
    // The fully transparent area keeps its border scaled, to a pixel: 16 of 64 columns are 32 of 128.
    const row = (await fitEdit({ image, mask }, 128, 128, 8)).mask!.subarray(64 * 128, 65 * 128);
    expect(Math.abs(row.filter((v) => v === 255).length - 32)).toBeLessThanOrEqual(1);
  });

  it('refuses a damaged file when it is checked, before its request queues', async () => {
    const file = await bigFlatPng();
    await expect(decodeInputImage(file.subarray(0, file.length - 2000), 'image')).rejects.toMatchObject({ status: 400, param: 'image', code: 'invalid_image_format' });
  });

  it("takes a photo the JPEG decoder only warns about (a Samsung phone's scan header), and still refuses one cut short", async () => {
    const jpeg = await sharp({ create: { width: 64, height: 32, channels: 3, background: { r: 200, g: 100, b: 50 } } }).jpeg().toBuffer();
    // Samsung's firmware writes a baseline JPEG's scan header with a spectral end (Se) of 0 instead of
    // 63: libjpeg warns "Invalid SOS parameters for sequential JPEG" and decodes it as every viewer does.
    const sos = jpeg.indexOf(Buffer.from([0xff, 0xda]));
    const samsung = Buffer.from(jpeg);
    samsung[sos + 5 + 2 * jpeg[sos + 4] + 1] = 0;
    const image = await decodeInputImage(samsung, 'image');
    const { image: fitted } = await fitEdit({ image }, 64, 32, 8);
    for (const [got, want] of [...fitted.pixels.subarray(0, 3)].map((v, i) => [v, [200, 100, 50][i]])) expect(Math.abs(got - want)).toBeLessThanOrEqual(2);
    await expect(decodeInputImage(jpeg.subarray(0, jpeg.length - 40), 'image')).rejects.toMatchObject({ status: 400, param: 'image', code: 'invalid_image_format' });
  });

  it('says a WebP cut short, or a JPEG damaged in its header, is damaged, not of a format it does not take', async () => {
    const flat = sharp({ create: { width: 64, height: 64, channels: 3, background: 'red' } });
    const webp = await flat.clone().webp().toBuffer();
    const jpeg = await flat.clone().jpeg().toBuffer();
    const cases: [Buffer, string][] = [
      [webp.subarray(0, webp.length - 10), 'webp'],
      [jpeg.subarray(0, jpeg.indexOf(Buffer.from([0xff, 0xda])) - 20), 'jpeg'],
    ];
    for (const [bytes, format] of cases) {
      const err = await failureOf<ApiError>(decodeInputImage(bytes, 'image'));
      expect(err).toMatchObject({ status: 400, param: 'image', code: 'invalid_image_format' });
      expect(err.message).toMatch(new RegExp(`the ${format} file is damaged .*Send the original file again`));
    }
    // Bytes of no format taken still say which formats are.
    const gif = await flat.clone().gif().toBuffer();
    expect((await failureOf<ApiError>(decodeInputImage(gif, 'image'))).message).toMatch(/unsupported image format/);
  });

  it('refuses a mask that marks nothing to repaint, rather than answering the picture unchanged', async () => {
    const image = await decodeInputImage(await sharp({ create: { width: 64, height: 64, channels: 3, background: 'red' } }).png().toBuffer(), 'image');
    const rgba = (alphaAt: (p: number) => number) => {
      const pixels = Buffer.alloc(64 * 64 * 4);
      for (let p = 0; p < 64 * 64; p++) pixels.set([255, 255, 255, alphaAt(p)], p * 4);
      return sharp(pixels, { raw: { width: 64, height: 64, channels: 4 } }).png().toBuffer();
    };
    // Painted opaque, with an alpha channel (an editor's export of a white canvas).
    const opaque = await decodeInputImage(await rgba(() => 255), 'mask');
    const err = await failureOf<ApiError>(fitEdit({ image, mask: opaque }, 64, 64, 8));
    expect(err).toMatchObject({ status: 400, param: 'mask', code: 'invalid_mask', message: expect.stringMatching(/no fully transparent pixel.*send no mask/) });
    // One transparent pixel marks it at its own size, and nothing once scaled down: said so.
    const speck = await decodeInputImage(await rgba((p) => (p === 32 * 64 + 32 ? 0 : 255)), 'mask');
    expect((await fitEdit({ image, mask: speck }, 64, 64, 8)).mask!.filter((v) => v === 255)).toHaveLength(1);
    expect(await failureOf<ApiError>(fitEdit({ image, mask: speck }, 16, 16, 8))).toMatchObject({ param: 'mask', message: expect.stringMatching(/scaled to 16x16/) });
    // So does a picture whose transparent pixels are its mask.
    const own = await decodeInputImage(await rgba((p) => (p === 32 * 64 + 32 ? 0 : 255)), 'image');
    expect(await failureOf<ApiError>(fitEdit({ image: own, mask: editMarks({ image: own }) }, 16, 16, 8))).toMatchObject({ param: 'image', code: 'invalid_mask' });
  });

  it('reads the alpha of a grey-and-alpha PNG, not its grey: black pixels are not transparent ones, nor light transparent ones opaque', async () => {
    // PIL's mode LA, GIMP's grey with alpha: stored as two channels. Left quarter black, the rest light grey; `alphaAt` of each pixel.
    const greyAlpha = async (alphaAt: (x: number) => number) => {
      const rgba = Buffer.alloc(64 * 64 * 4);
      for (let p = 0; p < 64 * 64; p++) rgba.fill(p % 64 < 16 ? 0 : 230, p * 4, p * 4 + 3).writeUInt8(alphaAt(p % 64), p * 4 + 3);
      const file = await sharp(rgba, { raw: { width: 64, height: 64, channels: 4 } }).toColourspace('b-w').png().toBuffer();
      expect((await sharp(file).metadata()).channels).toBe(2);
      return file;
    };
    // Opaque line art: edited whole. Before, its black read as transparent, and the edit was refused as a mask that marks nothing.
    const opaque = await decodeInputImage(await greyAlpha(() => 255), 'image');
    expect([opaque.hasAlpha, opaque.hasTransparentPixel, editMarks({ image: opaque })]).toEqual([true, false, undefined]);
    // Its right half erased: that half is repainted. Before, it read as opaque and the whole picture was redrawn.
    const erased = await decodeInputImage(await greyAlpha((x) => (x < 32 ? 255 : 0)), 'image');
    expect(erased.hasTransparentPixel).toBe(true);
    const { mask } = await fitEdit({ image: erased, mask: editMarks({ image: erased }) }, 64, 64, 8);
    expect([mask![0], mask![20], mask![40]]).toEqual([0, 0, 255]);
  });

  it("takes a mask for a phone photo's upright picture, and says so to one made from its sideways stored pixels", async () => {
    // Stored 64x32 with EXIF orientation 6 (turned a quarter clockwise to show): upright it is 32x64.
    const photo = await sharp({ create: { width: 64, height: 32, channels: 3, background: 'red' } }).jpeg().withMetadata({ orientation: 6 }).toBuffer();
    const image = await decodeInputImage(photo, 'image');
    expect([image.width, image.height, image.turned]).toEqual([32, 64, true]);
    const mask = async (width: number, height: number) =>
      decodeInputImage(await sharp({ create: { width, height, channels: 4, background: { r: 0, g: 0, b: 0, alpha: 0 } } }).png().toBuffer(), 'mask');
    expect(() => checkMask({ image, mask: undefined })).not.toThrow();
    checkMask({ image, mask: await mask(32, 64) });
    const sideways = await mask(64, 32);
    expect(() => checkMask({ image, mask: sideways })).toThrow(/mask is 64x32 but the image is 32x64; .*EXIF orientation turns it upright to 32x64.*draw the mask on the upright picture/);
    // Where the image is not turned, the same sizes get no word about orientation.
    expect(() => checkMask({ image: { ...image, turned: false }, mask: sideways })).toThrow(/they must be the same size\.$/);
    // A mask that kept the photo's orientation, for a picture that did not: its own orientation is named.
    // Before, it was told its upright size only, which no editor shows it.
    const stored = await decodeInputImage(await sharp({ create: { width: 64, height: 32, channels: 3, background: 'red' } }).png().toBuffer(), 'image');
    const turnedMask = await decodeInputImage(await sharp({ create: { width: 64, height: 32, channels: 4, background: { r: 0, g: 0, b: 0, alpha: 0 } } }).png().withMetadata({ orientation: 6 }).toBuffer(), 'mask');
    expect(() => checkMask({ image: stored, mask: turnedMask })).toThrow(/mask is 32x64 but the image is 64x32; .*The mask's EXIF orientation turns it upright to 32x64.*save the mask without that orientation/);
  });

  it("are fitted only once the request's plan passed: a refused edit costs no fitting", async () => {
    const server = await startTestServer({ stubCanEdit: true });
    try {
      const service = createImageService({ registry: server.registry, engine: server.engine, store: server.store, defaultModel: 'stub' });
      const image = await decodeInputImage(await bigFlatPng(), 'image');
      // Bytes that would fail as they are fitted (a 400 naming the file): the plan's own 400 must come first.
      const unfittable = { ...image, bytes: Buffer.from('not a picture any more') };
      const context = { signal: new AbortController().signal, urlFor: () => '', log: { info: () => undefined } };
      const edit = (body: Record<string, unknown>) => service.generate(parseImageRequest('edit', { model: 'stub', prompt: 'a blue square', ...body }), context, { kind: 'edit', image: unfittable });
      const refused = await failureOf<ApiError>(edit({ steps: 1, strength: 0.5 }));
      expect(refused).toMatchObject({ status: 400, param: 'strength', message: expect.stringMatching(/leaves no step to run/) });
      // The same edit with a plan that passes is fitted, and its damaged bytes found then.
      expect(await failureOf<ApiError>(edit({ steps: 4, strength: 0.5 }))).toMatchObject({ status: 400, code: 'invalid_image_format' });
    } finally {
      await server.close();
    }
  });
});

/** The most memory a process has held (its resident set's high-water mark), in bytes; Linux's /proc. */
async function peakResident(pid: number): Promise<number> {
  const line = (await readFile(`/proc/${pid}/status`, 'utf8')).split('\n').find((l) => l.startsWith('VmHWM:'))!;
  return Number(/\d+/.exec(line)![0]) * 1024;
}

const haveProc = existsSync('/proc/self/status');

describe.skipIf(!haveProc)(`pictures with transparency edited at once${haveProc ? '' : ' (skipped: needs /proc to read the server\'s peak memory)'}`, () => {
  it('are decoded whole a few at a time, not all together: 24 tiny uploads took a gigabyte more than 24 opaque ones', async () => {
    // A picture with alpha is decoded whole, its alpha dropped, before it is scaled (fitColour): 48 MiB
    // for 4096 x 4096, from a file of a few hundred KiB that UPLOAD_MEMORY counts as what it weighs.
    // sharp's jobs take turns on libuv's four threads in the order they came: every request's first
    // pass ran before any second one, so each held its whole picture until all had been decoded.
    const root = await makeRoot();
    const server = await spawnServer({ ...rootEnv(root), PORT: '0' });
    try {
      await untilReady(server.origin);
      const edit = async (file: Blob) => {
        const form = new FormData();
        for (const [key, value] of Object.entries({ model: MODEL, prompt: 'a blue square', size: '128x128', steps: '2', response_format: 'b64_json' })) form.set(key, value);
        form.set('image', file, 'in.png');
        return (await fetch(`${server.baseURL}/images/edits`, { method: 'POST', headers: auth, body: form })).status;
      };
      const atOnce = async (file: Blob) => expect(await Promise.all(Array.from({ length: 24 }, () => edit(file)))).toEqual(Array(24).fill(200));
      // The same edits of an opaque picture, scaled as it is decoded, first: what the server holds for
      // any 24 edits at once (the check's decodes, the allocator's arenas for sharp's threads) is then
      // the baseline, and the transparent ones may add their whole pictures two at a time, not 24.
      const opaque = await sharp({ create: { width: SIDE, height: SIDE, channels: 3, background: 'blue' } }).png().toBuffer();
      await atOnce(new Blob([new Uint8Array(opaque)]));
      const before = await peakResident(server.child.pid!);
      await atOnce(new Blob([new Uint8Array(await bigFlatPng())]));
      // 24 pictures decoded whole would be 1.1 GiB (it took 950 MiB more than the opaque ones); two at a time, 180 to 250.
      expect((await peakResident(server.child.pid!)) - before).toBeLessThan((24 * SIDE * SIDE * 3) / 2);
    } finally {
      server.child.kill('SIGKILL');
      await server.exited;
      await rm(root, { recursive: true, force: true });
    }
  });
});
