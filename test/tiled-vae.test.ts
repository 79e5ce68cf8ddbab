import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEMO_MODEL_DIR } from './helpers/demo-model.js';
import { decoder } from './helpers/vae-decoder.js';
import type { ModelLayout } from '../src/models/layout.js';
import { localMemory, MemoryPlan, vaeAttentionBytes, vaeTiling, type MemorySource } from '../src/pipelines/memory-plan.js';
import { tileSpans, toRgb, VaeDecoder, type VaeTiling } from '../src/pipelines/vae.js';
import { OnnxModel } from '../src/runtime/onnx-model.js';
import type { RgbImage } from '../src/runtime/types.js';
import { difference } from '../src/util/difference.js';
import { regionOf } from './helpers/pixel-region.js';
import { GOLDENS, haveRealExports, realExport } from './helpers/real-exports.js';

/**
 * Tiled VAE decoding: the same latents decoded whole and in overlapping, blended tiles give the same
 * picture (within a stated tolerance where the decoder is not local), and the memory plan picks tiles
 * exactly when the whole decode would not fit.
 */

/** Seeded standard-normal-ish latents (sum of uniforms): enough texture to show a seam. */
function latents(length: number, seed: number): Float32Array {
  let state = seed;
  const uniform = () => (state = (Math.imul(state, 1664525) + 1013904223) >>> 0) / 2 ** 32;
  return Float32Array.from({ length }, () => uniform() + uniform() + uniform() + uniform() - 2);
}

describe('the decoder output to 8-bit RGB', () => {
  it('gives the bytes of round(clamp(x / 2 + 0.5) x 255), exact halves and out-of-range values included', () => {
    const [height, width] = [3, 200];
    const plane = height * width;
    const chw = latents(3 * plane, 3).map((v) => v * 0.7);
    for (let k = 0; k < 256; k++) chw[k] = ((k + 0.5) / 255 - 0.5) * 2;
    const { pixels } = toRgb(chw, height, width);
    for (let i = 0; i < plane; i++) {
      for (let c = 0; c < 3; c++) expect(pixels[i * 3 + c]).toBe(Math.round(Math.min(1, Math.max(0, chw[c * plane + i] / 2 + 0.5)) * 255));
    }
  });
});

describe('tile spans', () => {
  it('cover the axis with the asked overlap, the last tile ending at the edge', () => {
    expect(tileSpans(64, 32, 8)).toEqual([
      { start: 0, size: 32, before: 0, after: 8 },
      { start: 24, size: 32, before: 8, after: 24 },
      { start: 32, size: 32, before: 24, after: 0 },
    ]);
    expect(tileSpans(24, 32, 8)).toEqual([{ start: 0, size: 24, before: 0, after: 0 }]);
    expect(() => tileSpans(64, 16, 16)).toThrow(/overlap/);
  });
});

describe('tiled VAE decode of the embedded model (a local decoder)', () => {
  let decoded: { layout: ModelLayout; vae: VaeDecoder };
  beforeAll(async () => {
    decoded = await decoder(DEMO_MODEL_DIR);
  });
  afterAll(() => decoded.vae.release());

  /**
   * The reference decoder is local but for its linear upsampling, whose outermost pixels of a tile miss
   * the neighbour beyond the edge; the blend gives them almost no weight. Measured: mean 0.016/255, max 3.
   */
  it('gives the whole decode within 3/255 (mean under 0.1/255), whether asked for or chosen by its tiler', async () => {
    const [c, h, w] = [4, 64, 96];
    const z = latents(c * h * w, 1);
    const [whole] = await decoded.vae.decode(z, 1, c, h, w);
    const [tiled] = await decoded.vae.decode(z, 1, c, h, w, { tile: 32, overlap: 8 });
    expect([tiled.width, tiled.height]).toEqual([whole.width, whole.height]);
    const { mean, largest } = difference(whole.pixels, tiled.pixels);
    console.log(`embedded model tiled vs whole: mean ${mean.toFixed(3)}, max ${largest}`);
    expect(largest).toBeLessThanOrEqual(3);
    expect(mean).toBeLessThan(0.1);
    const model = await OnnxModel.load(decoded.layout.vaeDecoder, { provider: 'cpu', threads: 2 }, { memoryArena: false });
    const chooser = new VaeDecoder(model, decoded.layout.vae.scalingFactor, decoded.layout.vae.shiftFactor, () => ({ tile: 32, overlap: 8 }));
    const [chosen] = await chooser.decode(z, 1, c, h, w);
    await chooser.release();
    expect(chosen.pixels).toEqual(tiled.pixels);
  });
});

describe.skipIf(!haveRealExports)('tiled VAE decode of the real SD 1.5 architecture (needs ../shared/data/real-exports)', () => {
  let decoded: { layout: ModelLayout; vae: VaeDecoder };
  beforeAll(async () => {
    decoded = await decoder(realExport('sd15'));
  });
  afterAll(() => decoded.vae.release());

  /**
   * Its decoder is not local (group norms over the whole picture, attention over every latent pixel),
   * so tiles cannot match exactly. Measured on diffusers' golden latents at 512x512 in tiles of 256
   * with 64 pixels of overlap (smaller tiles than the memory plan ever picks): mean difference
   * 2.4/255, largest 44/255 in a few pixels. The bound: a mean under 4/255, and the seams no worse than
   * the rest of the picture, while hard-edged tiles (no overlap) show theirs (mean 27/255 there).
   */
  it('matches the whole decode within 4/255 on average, with no visible seams', async () => {
    const z = new Float32Array((await readFile(path.join(GOLDENS, 'sd15-case0-latents.f32'))).buffer.slice(0));
    const [c, h, w] = [4, 64, 64];
    // diffusers' golden starting latents: noise, the hardest texture to tile without seams.
    const [whole] = await decoded.vae.decode(z, 1, c, h, w);
    const tiling: VaeTiling = { tile: 32, overlap: 8 };
    const [tiled] = await decoded.vae.decode(z, 1, c, h, w, tiling);
    const [hard] = await decoded.vae.decode(z, 1, c, h, w, { tile: 32, overlap: 0 });
    // Pixels within 4 of a tile edge (latent 32 -> pixel 256) are where a seam would show.
    const seam = (x: number, y: number) => Math.abs(x - 256) < 4 || Math.abs(y - 256) < 4;
    const atSeam = (image: RgbImage) => regionOf(image.pixels, image.width, seam);
    const overall = difference(whole.pixels, tiled.pixels);
    const atSeams = difference(atSeam(whole), atSeam(tiled));
    const hardSeams = difference(atSeam(whole), atSeam(hard));
    console.log(`sd15 tiled vs whole: mean ${overall.mean.toFixed(2)}, max ${overall.largest}; at the seams ${atSeams.mean.toFixed(2)} (hard tiles ${hardSeams.mean.toFixed(2)})`);
    expect(overall.mean).toBeLessThan(4);
    expect(atSeams.mean).toBeLessThan(2 * overall.mean + 1);
    expect(hardSeams.mean).toBeGreaterThan(atSeams.mean * 1.5);
  });
});

describe('the memory plan decides when to tile', () => {
  const layout = { dir: '/models/sdxl', vae: { scalingFactor: 0.13025, shiftFactor: 0, scaleFactor: 8, midBlockAttention: true }, denoiserConfig: {} };
  const GiB = 1024 ** 3;

  it('decodes whole while the attention fits and otherwise in the largest tiles of 256, 512, 1024... pixels that fit', () => {
    expect(vaeTiling(layout, 128, 128, 4 * GiB)).toBeUndefined();
    // 1792x1024 within 4 GiB: tiles of 1024 pixels (128 latent; their attention 3 GiB), not of 512.
    expect(vaeTiling(layout, 224, 128, 4 * GiB)).toEqual({ tile: 128, overlap: 32 });
    const tiling = vaeTiling(layout, 128, 128, GiB)!;
    expect(tiling).toEqual({ tile: 64, overlap: 16 });
    expect(vaeAttentionBytes(layout, 128 * 8, 128 * 8)).toBeGreaterThan(GiB);
    expect(vaeTiling({ vae: { ...layout.vae, midBlockAttention: false } }, 224, 128, 1)).toBeUndefined();
  });

  it("keeps an image's tiles while the budget moves within a rung: the tile decides the picture", () => {
    // Every multiple of 8 that fit was taken before: 104 latent pixels in 1.5 GiB, 112 in 2 GiB.
    expect(vaeTiling(layout, 128, 128, 1.5 * GiB)).toEqual(vaeTiling(layout, 128, 128, 2 * GiB));
  });

  it('tiles an image as it would be decoded alone: neither the images beside it nor other batches change its picture', async () => {
    // Denoising measured at 0.35 GiB an image at 1024x1024, a decoder call at 512x512 at 1 GiB, and
    // 2 GiB to plan with: one image leaves its decoder 1.65 GiB, tiles of 64 latent pixels (1 GiB).
    // Three images leave 0.95 GiB, where tiles of 32 would fit (and did, before): they run two at a
    // time in tiles of 64 instead.
    const decode = { pixels: 512 * 512, bytes: GiB, attentionBytes: vaeAttentionBytes(layout, 512, 512) };
    const known = { [layout.dir]: { weightsBytes: 0, peakBytes: 0, peakPixels: 0, denoise: [{ pixels: 1024 * 1024, bytes: 0.35 * GiB }], decode } };
    const batch = (images: number) => ({ width: 1024, height: 1024, items: Array.from({ length: images }, (_, seed) => ({ prompt: '', negativePrompt: '', seed })) });
    /** What the pool's arbiter grants: `budget` now, less than `alone` where another worker's batch planned the rest; a plan that fits only alone waits for it. */
    const granting = (budget: number, alone: number): MemorySource => ({
      reserve: async (plan) => {
        const now = plan(budget, alone);
        return now ? { plan: now, budget } : { plan: plan(alone, alone), budget: alone };
      },
      exclusive: (work) => work(),
    });
    const run = async (source: MemorySource, images: number) => {
      const plan = new MemoryPlan(known, source);
      const tiler = plan.vaeTiler(layout);
      return { perRun: await plan.imagesPerRun(layout, batch(images), 'sdxl'), tiling: tiler(128, 128) };
    };
    const alone = await run(granting(2 * GiB, 2 * GiB), 1);
    expect(alone.tiling).toEqual({ tile: 64, overlap: 16 });
    expect(await run(granting(2 * GiB, 2 * GiB), 3)).toEqual({ perRun: 2, tiling: alone.tiling });
    // 1.3 GiB left beside another worker's batch, where tiles of 32 would fit: it waits for that batch instead.
    expect((await run(granting(1.3 * GiB, 2 * GiB), 1)).tiling).toEqual(alone.tiling);
  });

  it("sizes tiles by all a decoder call was measured to take, not by its attention alone", async () => {
    // A decoder measured at 512x512 taking 2.3 GiB, of which 0.19 GiB attention: the rest grows with the tile's pixels.
    const decode = { pixels: 512 * 512, bytes: 2.3 * GiB, attentionBytes: vaeAttentionBytes(layout, 512, 512) };
    const plan = new MemoryPlan({ [layout.dir]: { weightsBytes: 0, peakBytes: GiB, peakPixels: 512 * 512, decode } }, localMemory(2.5 * GiB));
    const tiler = plan.vaeTiler(layout);
    expect(await plan.imagesPerRun(layout, { width: 1792, height: 1024, items: [{ prompt: '', negativePrompt: '', seed: 1 }] }, 'sdxl')).toBe(1);
    const tile = tiler(224, 128)!.tile;
    const byAttention = vaeTiling(layout, 224, 128, 2.5 * GiB * 0.9)!.tile;
    expect(tile).toBeLessThan(byAttention);
    const side = tile * 8;
    const rest = (decode.bytes - decode.attentionBytes) * Math.max(1, (side * side) / decode.pixels);
    expect(rest + vaeAttentionBytes(layout, side, side)).toBeLessThanOrEqual(2.5 * GiB * 0.9);
  });

  it("tiles every image with a side over 64 latent pixels with VAE_TILING=always, in tiles of at most 64, and in smaller ones when given their side", async () => {
    expect(vaeTiling(layout, 64, 64, Infinity, 64)).toBeUndefined();
    expect(vaeTiling(layout, 96, 64, Infinity, 64)).toEqual({ tile: 64, overlap: 16 });
    // Memory still bounds the tile below 64, to the next rung.
    expect(vaeTiling(layout, 128, 128, vaeAttentionBytes(layout, 40 * 8, 40 * 8), 64)?.tile).toBe(32);
    const plan = new MemoryPlan({}, localMemory(), 'always');
    const tiler = plan.vaeTiler(layout);
    expect(await plan.imagesPerRun(layout, { width: 1024, height: 1024, items: [{ prompt: '', negativePrompt: '', seed: 1 }] }, 'sdxl')).toBe(1);
    expect(tiler(128, 128)).toEqual({ tile: 64, overlap: 16 });
    // A tile side in pixels (VAE_TILING=256): 32 latent pixels with the 8x VAE.
    const small = new MemoryPlan({}, localMemory(), 256);
    const smallTiler = small.vaeTiler(layout);
    expect(await small.imagesPerRun(layout, { width: 1024, height: 1024, items: [{ prompt: '', negativePrompt: '', seed: 1 }] }, 'sdxl')).toBe(1);
    expect([smallTiler(128, 128), smallTiler(32, 32)]).toEqual([{ tile: 32, overlap: 8 }, undefined]);
  });

  it('lets a size run that only tiles fit once the model decodes through its tiler', async () => {
    const plan = new MemoryPlan({}, localMemory(2 * GiB));
    const batch = { width: 1792, height: 1024, items: [{ prompt: '', negativePrompt: '', seed: 1 }] };
    await expect(plan.imagesPerRun(layout, batch, 'sdxl')).rejects.toThrow(/needs about/);
    const tiler = plan.vaeTiler(layout);
    expect(await plan.imagesPerRun(layout, batch, 'sdxl')).toBe(1);
    expect(tiler(224, 128)?.tile).toBeGreaterThanOrEqual(32);
    expect(tiler(64, 64)).toBeUndefined();
  });
});
