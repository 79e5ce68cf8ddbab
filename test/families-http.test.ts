import path from 'node:path';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { REFERENCE_FAMILIES } from '../src/reference/index.js';
import { readImageFile } from './helpers/picture.js';
import { startRealServer, UNMEASURED, type RealServer } from './helpers/real-server.js';

/**
 * Every reference family, installed as a user would (one folder per model in MODELS_DIR), asked
 * through the real HTTP route with the official SDK: the picture shows the prompted colour and shape.
 */

let real: RealServer;
let client: OpenAI;

beforeAll(async () => {
  // One worker: each family loads once, where two loaded most of them twice (the prompts ran side by side).
  // Not calibrated as they load (UNMEASURED): what they draw is tested here, their memory plans in memory*.test.ts.
  real = await startRealServer({
    modelsDir: inject('referenceModelsDir'),
    env: { WORKERS: '1', PRELOAD: 'none' },
    figures: (modelsDir) => Object.fromEntries(REFERENCE_FAMILIES.map((family) => [path.resolve(modelsDir, family), UNMEASURED])),
  });
  client = real.client;
});

afterAll(() => real?.close());

/**
 * Families distilled for a few steps run their hd preset (a single step of the exact reference denoiser
 * is a blend of shapes, though real SD-Turbo draws well in one); the others get enough steps for any sampler.
 */
const FEW_STEP = new Set(['sd-turbo', 'lcm', 'flux-schnell']);

/**
 * Two prompts that differ in colour and shape: a family that drew one picture whatever it was asked
 * fails one. The streaming test below asks each family for a third, a blue square.
 */
const PROMPTS = [
  { prompt: 'a red circle', colour: 'red', shape: 'circle' },
  { prompt: 'a green triangle', colour: 'green', shape: 'triangle' },
];

describe('every reference family through POST /v1/images/generations', () => {
  for (const family of REFERENCE_FAMILIES) {
    it(`${family} draws what the prompt asks at its smallest listed size`, async () => {
      const model = (await client.models.retrieve(family)) as unknown as { sizes: string[] };
      const size = [...model.sizes].sort((x, y) => area(x) - area(y))[0];
      const results = await Promise.all(
        PROMPTS.map(({ prompt }) =>
          client.images.generate({
            model: family,
            prompt,
            size,
            response_format: 'b64_json',
            seed: 11,
            ...(FEW_STEP.has(family) ? { quality: 'hd' } : { steps: 20 }),
          } as unknown as OpenAI.ImageGenerateParamsNonStreaming),
        ),
      );
      for (const [i, res] of results.entries()) {
        const { info, reading } = await readImageFile(Buffer.from(res.data![0].b64_json!, 'base64'));
        expect(`${info.width}x${info.height}`).toBe(size);
        expect({ colour: reading.colour, shape: reading.shape }).toEqual({ colour: PROMPTS[i].colour, shape: PROMPTS[i].shape });
      }
    });
  }
});

describe('every reference family streams previews of its picture', () => {
  for (const family of REFERENCE_FAMILIES) {
    it(`${family}: the preview halfway through shows the picture the prompt asks for`, async () => {
      const model = (await client.models.retrieve(family)) as unknown as { sizes: string[] };
      const size = [...model.sizes].sort((x, y) => area(x) - area(y))[0];
      const stream = await client.images.generate({
        model: family,
        prompt: 'a blue square',
        size,
        seed: 5,
        stream: true,
        partial_images: 1,
        // The few-step families get enough steps for a preview halfway to show one picture, not a blend.
        steps: 20,
      } as unknown as OpenAI.ImageGenerateParamsStreaming);
      const events: OpenAI.ImageGenStreamEvent[] = [];
      for await (const event of stream) events.push(event);
      expect(events.map((e) => e.type)).toEqual(['image_generation.partial_image', 'image_generation.completed']);
      for (const event of events) {
        const { info, reading } = await readImageFile(Buffer.from(event.b64_json, 'base64'));
        expect([`${info.width}x${info.height}`, reading.colour, reading.shape]).toEqual([size, 'blue', 'square']);
      }
    });
  }
});

describe('guidance_scale on a model distilled to run without guidance', () => {
  const generate = (model: string, guidance_scale: number) =>
    client.images.generate({ model, prompt: 'a red circle', response_format: 'b64_json', steps: 1, guidance_scale } as unknown as OpenAI.ImageGenerateParamsNonStreaming);

  it('is a 400 naming the model and the param on FLUX schnell above 1 (it would be ignored); 0 and 1 ask for none and run', async () => {
    const err = await generate('flux-schnell', 7.5).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect(err).toMatchObject({ status: 400, param: 'guidance_scale', code: 'unsupported_value' });
    expect((err as Error).message).toMatch(/'guidance_scale' 7\.5 with model 'flux-schnell': it is a flux-schnell model, distilled to run without guidance/);
    for (const scale of [0, 1]) expect((await generate('flux-schnell', scale)).data).toHaveLength(1);
    // FLUX dev takes its guidance as an input; SD-Turbo runs a classifier-free batch for it.
    for (const model of ['flux-dev', 'sd-turbo']) expect((await generate(model, 7.5)).data).toHaveLength(1);
  });
});

describe('negative_prompt on a model that has no classifier-free batch', () => {
  const generate = (model: string, negative_prompt: string) =>
    client.images.generate({ model, prompt: 'a red circle', response_format: 'b64_json', steps: 1, negative_prompt } as unknown as OpenAI.ImageGenerateParamsNonStreaming);

  it('is a 400 naming the model and the param on FLUX and LCM (it would be ignored); empty, it runs; SD models take one', async () => {
    for (const model of ['flux-schnell', 'flux-dev', 'lcm']) {
      const err = await generate(model, 'blurry').catch((e: unknown) => e);
      expect(err, model).toBeInstanceOf(OpenAI.BadRequestError);
      expect(err).toMatchObject({ status: 400, param: 'negative_prompt', code: 'unsupported_value' });
      expect((err as Error).message).toContain(`'negative_prompt' with model '${model}': it is a`);
      expect((await generate(model, '')).data).toHaveLength(1);
    }
    // At a guidance of 1 or less SD-Turbo ignores it, as diffusers does: its guidance_scale decides.
    for (const model of ['sd15-optimum', 'sd-turbo']) expect((await generate(model, 'blurry')).data).toHaveLength(1);
  });
});

function area(size: string): number {
  const [w, h] = size.split('x').map(Number);
  return w * h;
}
