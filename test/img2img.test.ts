import { rm } from 'node:fs/promises';
import path from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import type { GenerationBatch, RgbImage } from '../src/runtime/types.js';
import { WorkerRuntime } from '../src/pipelines/run.js';
import { readPicture } from './helpers/picture.js';
import { copyOfReference, referenceModel } from './helpers/reference.js';

/**
 * Image-to-image in the pipelines: the input encoded by the VAE encoder, noised to the step `strength`
 * leaves, denoised with the new prompt. The reference models know the right answer: a red circle
 * edited with "a blue square" at strength 1 becomes a blue square, at a low strength stays red.
 */

const SIZE = 256;
const guided = (family: string) => !/turbo|schnell/.test(family);
// PNDM (sd15-legacy) needs more steps than the others to settle on the prompt's picture.
const stepsOf = (family: string) => (family === 'sd15-legacy' ? 25 : 8);
const batchFor = (family: string, dir = referenceModel(family)): Omit<GenerationBatch, 'items'> => ({
  modelDir: dir,
  width: SIZE,
  height: SIZE,
  steps: stepsOf(family),
  guidanceScale: guided(family) ? 7.5 : 0,
});
const reading = (image: RgbImage) => readPicture(image.pixels, image.width, image.height);

async function redCircle(family: string): Promise<RgbImage> {
  const [image] = await runtime.generateImages({ ...batchFor(family), items: [{ prompt: 'a red circle', negativePrompt: '', seed: 1 }] });
  expect(reading(image)).toMatchObject({ colour: 'red', shape: 'circle' });
  return image;
}

async function edit(family: string, image: RgbImage, strength: number) {
  const [out] = await runtime.generateImages({ ...batchFor(family), strength, items: [{ prompt: 'a blue square', negativePrompt: '', seed: 2, image }] });
  return reading(out);
}

let runtime: WorkerRuntime;
beforeAll(() => {
  runtime = new WorkerRuntime({ runtime: { provider: 'cpu', threads: 2 } });
});

describe('image-to-image', () => {
  // The last strength keeps the input: the lowest that leaves a step for the family's schedule (for the
  // LCM, whose own pipeline runs every step among the distilled timesteps a strength leaves: the lowest
  // that leaves its 8, int(50 x 0.16).
  for (const [family, low] of [
    ['sd15-optimum', 0.25],
    ['sd15-legacy', 0.25],
    ['sd2-v', 0.25],
    ['sdxl', 0.25],
    ['flux-schnell', 0.25],
    ['sd-turbo', 0.125],
    ['lcm', 0.16],
  ] as const) {
    it(`${family}: strength 1 draws the new prompt, a low strength keeps the input`, async () => {
      const red = await redCircle(family);
      expect(await edit(family, red, 1)).toMatchObject({ colour: 'blue', shape: 'square' });
      expect(await edit(family, red, low)).toMatchObject({ colour: 'red' });
    });
  }

  it('is reproducible from its seed', async () => {
    const red = await redCircle('sd15-optimum');
    const run = () => runtime.generateImages({ ...batchFor('sd15-optimum'), strength: 0.5, items: [{ prompt: 'a blue square', negativePrompt: '', seed: 7, image: red }] });
    const [a, b] = [await run(), await run()];
    expect(Buffer.compare(Buffer.from(a[0].pixels), Buffer.from(b[0].pixels))).toBe(0);
  });

  it('says what is wrong with an item without its image, an image of another size, or a strength that leaves no step', async () => {
    const red = await redCircle('sd15-optimum');
    const item = { prompt: 'a blue square', negativePrompt: '', seed: 1 };
    const base = batchFor('sd15-optimum');
    await expect(runtime.generateImages({ ...base, strength: 0.5, items: [item] })).rejects.toThrow(/item 0 has no image/);
    await expect(runtime.generateImages({ ...base, width: 512, height: 512, strength: 0.5, items: [{ ...item, image: red }] })).rejects.toThrow(/256x256; the batch makes 512x512/);
    await expect(runtime.generateImages({ ...base, strength: 0.1, items: [{ ...item, image: red }] })).rejects.toThrow(/leaves no step/);
  });

  it('names the missing VAE encoder of an export without one', async () => {
    const dir = await copyOfReference('sd15-optimum');
    await rm(path.join(dir, 'vae_encoder'), { recursive: true });
    const red = await redCircle('sd15-optimum');
    await expect(runtime.generateImages({ ...batchFor('sd15-optimum', dir), strength: 0.5, items: [{ prompt: 'x', negativePrompt: '', seed: 1, image: red }] })).rejects.toThrow(
      /image-to-image needs vae_encoder\/model\.onnx/,
    );
  });

  // sd15-inpainting has a 9-channel inpainting UNet, told the mask and the kept picture's latents: it
  // keeps the unmasked half itself (nothing is put back). The other families blend the kept area back.
  describe('with a mask (inpainting by masked blending, or by an inpainting UNet)', () => {
    /** Mean absolute difference of two pictures over columns [from, to). */
    const columnsDiff = (a: RgbImage, b: RgbImage, from: number, to: number) => {
      let [sum, count] = [0, 0];
      for (let y = 0; y < a.height; y++) {
        for (let x = from; x < to; x++) {
          for (let c = 0; c < 3; c++) sum += Math.abs(a.pixels[(y * a.width + x) * 3 + c] - b.pixels[(y * b.width + x) * 3 + c]);
          count += 3;
        }
      }
      return sum / count;
    };
    /** Whether most of the picture's red is in its left half. */
    const redOnTheLeft = ({ pixels }: RgbImage) => {
      let [left, right] = [0, 0];
      for (let i = 0; i < SIZE * SIZE; i++) {
        const red = pixels[3 * i] - (pixels[3 * i + 1] + pixels[3 * i + 2]) / 2;
        if (red > 64) (i % SIZE < SIZE / 2 ? left++ : right++);
      }
      return left > right;
    };

    for (const family of ['sd15-optimum', 'flux-schnell', 'lcm', 'sd15-inpainting']) {
      it(`${family}: changes only the masked half, and nothing with an empty mask`, async () => {
        const red = await redCircle(family);
        const run = async (mask: Uint8Array | undefined) => {
          const [out] = await runtime.generateImages({ ...batchFor(family), strength: 1, items: [{ prompt: 'a blue square', negativePrompt: '', seed: 3, image: red, mask }] });
          return out;
        };
        // The half the red circle is in is repainted: that must remove the circle, whatever the prompt draws there.
        const left = redOnTheLeft(red);
        const repaintHalf = Uint8Array.from({ length: SIZE * SIZE }, (_, i) => ((i % SIZE < SIZE / 2) === left ? 255 : 0));
        const [masked, unmasked, none] = [await run(repaintHalf), await run(undefined), await run(new Uint8Array(SIZE * SIZE))];
        const sides: [number, number][] = [[0, SIZE / 2 - 16], [SIZE / 2 + 16, SIZE]];
        const [maskedSide, keptSide] = left ? sides : [sides[1], sides[0]];
        // Without a mask the whole picture turns into a blue square; with one the kept half stays the input's
        // (to within the VAE's rounding at the seam) and the masked half, the circle's, changes.
        expect(reading(unmasked)).toMatchObject({ colour: 'blue', shape: 'square' });
        expect(columnsDiff(masked, red, ...keptSide)).toBeLessThan(3);
        expect(columnsDiff(masked, red, ...maskedSide)).toBeGreaterThan(4 * columnsDiff(masked, red, ...keptSide));
        expect(reading(none)).toMatchObject({ colour: 'red', shape: 'circle' });
      });
    }

    it('says so when a mask does not match its image', async () => {
      const red = await redCircle('sd15-optimum');
      const item = { prompt: 'x', negativePrompt: '', seed: 1, image: red, mask: new Uint8Array(10) };
      await expect(runtime.generateImages({ ...batchFor('sd15-optimum'), strength: 1, items: [item] })).rejects.toThrow(/mask of item 0 has 10 pixels; the batch makes 256x256/);
    });
  });
});
