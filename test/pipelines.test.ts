import { readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import type { BatchItem, GenerationBatch } from '../src/runtime/types.js';
import { WorkerRuntime } from '../src/pipelines/run.js';
import { schedulersFor } from '../src/schedulers/index.js';
import { readPicture, type Reading } from './helpers/picture.js';
import { copyOfReference, referenceModel } from './helpers/reference.js';
import { largestDifference } from '../src/util/difference.js';

/** This file's own worker runtime, in this process. */
const runtime = new WorkerRuntime();

/** Switched on by one test to break the sampler on purpose: every scheduler skips its input scaling. */
const sabotage = vi.hoisted(() => ({ skipInputScaling: false }));
vi.mock('../src/schedulers/index.js', async (importOriginal) => {
  const real = await importOriginal<typeof import('../src/schedulers/index.js')>();
  return {
    ...real,
    createScheduler: (...args: Parameters<typeof real.createScheduler>) => {
      const scheduler = real.createScheduler(...args);
      if (sabotage.skipInputScaling) scheduler.scaleModelInput = (sample) => sample;
      return scheduler;
    },
  };
});

/**
 * End to end through the real pipelines and ONNX sessions: every reference family, with its default
 * scheduler and every other scheduler that applies, must draw the colour and shape the prompt asks for.
 * The reference models are exact denoisers, so a wrong sampler shows as a wrong or noisy picture.
 */

interface FamilyCase {
  family: string;
  kind: 'vp' | 'flow';
  steps: number;
  guidance: number;
  size: number;
}

const FAMILIES: FamilyCase[] = [
  { family: 'sd15-legacy', kind: 'vp', steps: 20, guidance: 7.5, size: 256 },
  { family: 'sd15-optimum', kind: 'vp', steps: 20, guidance: 7.5, size: 256 },
  { family: 'sd15-fp16', kind: 'vp', steps: 20, guidance: 7.5, size: 256 },
  { family: 'sd2-v', kind: 'vp', steps: 20, guidance: 7.5, size: 256 },
  { family: 'sd-turbo', kind: 'vp', steps: 4, guidance: 0, size: 256 },
  { family: 'sdxl', kind: 'vp', steps: 20, guidance: 5, size: 256 },
  { family: 'lcm', kind: 'vp', steps: 4, guidance: 8, size: 256 },
  { family: 'flux-schnell', kind: 'flow', steps: 4, guidance: 0, size: 256 },
  { family: 'flux-dev', kind: 'flow', steps: 12, guidance: 3.5, size: 256 },
];

const PROMPTS = [
  { prompt: 'a red circle', colour: 'red', shape: 'circle' },
  { prompt: 'a blue square', colour: 'blue', shape: 'square' },
  { prompt: 'a green triangle', colour: 'green', shape: 'triangle' },
] as const;

function batchFor(c: FamilyCase, items: BatchItem[], scheduler?: string, modelDir = referenceModel(c.family)): GenerationBatch {
  return { modelDir, width: c.size, height: c.size, steps: c.steps, guidanceScale: c.guidance, scheduler, items };
}

async function readAll(batch: GenerationBatch): Promise<Reading[]> {
  const images = await runtime.generateImages(batch);
  return images.map((img) => readPicture(img.pixels, img.width, img.height));
}

const SEED = 11;
const promptItems = (seed: number): BatchItem[] => PROMPTS.map((p, i) => ({ prompt: p.prompt, negativePrompt: '', seed: seed + i }));

/**
 * A right sampler lands on a prototype: the asked colour and shape on a clean background (0.87 is the
 * rounding of the grey itself). A wrong one leaves grain, blur or the wrong figure.
 */
const CLEAN_BACKGROUND = 1.5;
/**
 * Some samplers leave a little noise, as they do in diffusers: PNDM reuses earlier noise estimates (its
 * linear multistep), and PNDM or DDIM without `set_alpha_to_one` stop at abar_0 rather than at zero
 * noise (sqrt(1 - abar_0) = 0.029 of latent noise, about 4 grey levels).
 */
const RESIDUAL_NOISE_BACKGROUND = 5;

async function backgroundAllowance(modelDir: string, scheduler: string | undefined): Promise<number> {
  const config = JSON.parse(await readFile(path.join(modelDir, 'scheduler', 'scheduler_config.json'), 'utf8'));
  const name = scheduler ?? { PNDMScheduler: 'pndm', DDIMScheduler: 'ddim' }[config._class_name as string];
  const leavesNoise = name === 'pndm' || (name === 'ddim' && config.set_alpha_to_one !== true);
  return leavesNoise ? RESIDUAL_NOISE_BACKGROUND : CLEAN_BACKGROUND;
}

function describeReading(r: Reading, allowance: number) {
  return { colour: r.colour, shape: r.shape, clean: r.colourError < 40 && r.backgroundNoise < allowance };
}

function expectMatches(readings: Reading[], allowance: number): void {
  expect(readings.map((r) => describeReading(r, allowance))).toEqual(PROMPTS.map((p) => ({ colour: p.colour, shape: p.shape, clean: true })));
}

function countMatches(readings: Reading[]): number {
  const want = (i: number) => JSON.stringify({ colour: PROMPTS[i % PROMPTS.length].colour, shape: PROMPTS[i % PROMPTS.length].shape, clean: true });
  return readings.filter((r, i) => JSON.stringify(describeReading(r, CLEAN_BACKGROUND)) === want(i)).length;
}

for (const c of FAMILIES) {
  describe(`${c.family}`, () => {
    // undefined = the model's own scheduler_config.json
    const schedulers = [undefined, ...schedulersFor(c.kind)];
    for (const scheduler of schedulers) {
      it(`draws the prompted colour and shape with ${scheduler ?? 'its default scheduler'}`, async () => {
        // LCM is a few-step sampler; PNDM's first steps are its warm-up, so it needs more than 4.
        const steps = scheduler === 'lcm' ? 4 : scheduler === 'pndm' ? Math.max(c.steps, 20) : c.steps;
        const batch = { ...batchFor(c, promptItems(SEED), scheduler), steps };
        expectMatches(await readAll(batch), await backgroundAllowance(batch.modelDir, scheduler));
      });
    }

    it('gives identical pixels for the same seed and different pictures for different seeds', async () => {
      const items = [1, 1, 2, 3, 4].map((seed) => ({ prompt: 'a yellow shape', negativePrompt: '', seed }));
      const images = await runtime.generateImages(batchFor(c, items));
      expect(Buffer.compare(images[0].pixels, images[1].pixels)).toBe(0);
      const distinct = new Set(images.slice(1).map((img) => Buffer.from(img.pixels).toString('base64')));
      expect(distinct.size).toBeGreaterThanOrEqual(3);
      // Seeds are per image: the same seed alone gives the same picture as inside a batch (up to one
      // level of rounding, since the runtime may sum in another order for another batch size).
      const [alone] = await runtime.generateImages(batchFor(c, [items[3]]));
      expect(largestDifference(alone.pixels, images[3].pixels)).toBeLessThanOrEqual(1);
    });
  });
}

describe('a broken sampler is caught', () => {
  const base = FAMILIES.find((f) => f.family === 'sd15-optimum')!;

  /** A copy of the model whose scheduler config disagrees with how it was trained. */
  async function withSchedulerConfig(change: Record<string, unknown>): Promise<string> {
    const dir = await copyOfReference(base.family);
    const file = path.join(dir, 'scheduler', 'scheduler_config.json');
    const config = JSON.parse(await readFile(file, 'utf8'));
    await writeFile(file, JSON.stringify({ ...config, ...change }));
    return dir;
  }

  afterEach(() => {
    sabotage.skipInputScaling = false;
  });

  /** Every prompt at several seeds: the exact denoiser forgives a broken sampler on some of them. */
  const seeds = [11, 101, 202, 303];
  const readAllSeeds = async (dir?: string) => (await Promise.all(seeds.map((seed) => readAll(batchFor(base, promptItems(seed), 'euler', dir))))).flat();
  const images = seeds.length * PROMPTS.length;

  it('passes the check with the right sampler (the control)', async () => {
    expect(countMatches(await readAllSeeds())).toBe(images);
  });

  it('fails the check with a wrong sigma table (linear betas instead of scaled_linear)', async () => {
    const dir = await withSchedulerConfig({ beta_schedule: 'linear', beta_start: 0.0001, beta_end: 0.02 });
    expect(countMatches(await readAllSeeds(dir))).toBeLessThanOrEqual(images / 4);
  });

  it('fails the check when Euler skips its input scaling', async () => {
    sabotage.skipInputScaling = true;
    // Measured over 60 images: about a third come out wrong or noisy (the rest still land on a prototype).
    expect(countMatches(await readAllSeeds())).toBeLessThan(images);
  });
});
