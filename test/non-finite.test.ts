import { describe, expect, it } from 'vitest';
import type { ApiError } from '../src/api/errors.js';
import { engineError } from '../src/service/failures.js';
import { demoBatch } from './helpers/demo-model.js';
import { withDemoPool } from './helpers/demo-pool.js';
import { referenceModel } from './helpers/reference.js';
import { decoder } from './helpers/vae-decoder.js';

/**
 * A model whose arithmetic overflows (fp16, most often) makes NaN, which the conversion to 8-bit drew as
 * a black picture with a 200. It is an error that says whose output it was and what to install instead.
 */

describe('non-finite model output', () => {
  it("blames an fp16 VAE decoder that overflows on latents beyond fp16's range, not the latents, which the fp32 decoder decodes", async () => {
    const [c, h, w] = [4, 16, 16];
    // 20000 / 0.18215 (SD's scaling factor) is past fp16's largest value, 65504: the fp16 decoder's input is infinite.
    const large = new Float32Array(c * h * w).fill(20_000);
    const [{ vae: fp16 }, { vae: fp32 }] = [await decoder(referenceModel('sd15-fp16')), await decoder(referenceModel('sd15-optimum'))];
    try {
      await expect(fp16.decode(new Float32Array(c * h * w).fill(10_000), 1, c, h, w)).resolves.toHaveLength(1);
      await expect(fp16.decode(large, 1, c, h, w)).rejects.toMatchObject({ name: 'NonFiniteOutputError', stage: 'vae_decoder', message: /VAE decoder turned finite latents into NaN/ });
      await expect(fp32.decode(large, 1, c, h, w)).resolves.toHaveLength(1);
    } finally {
      await Promise.all([fp16.release(), fp32.release()]);
    }
  });

  it('reaches the client from a worker process as a 500 naming the model and the denoiser, not to be retried; the worker goes on', async () => {
    await withDemoPool(async (pool) => {
      const [width, height] = [256, 256];
      const nan = new Float32Array(4 * (width / 8) * (height / 8)).fill(NaN);
      const failed = await pool.generate(demoBatch({ width, height, steps: 2, items: [{ prompt: 'a red circle', negativePrompt: '', seed: 1, initialNoise: nan }] })).catch((err: unknown) => err);
      const answer = engineError(failed, 'demo') as ApiError;
      expect([answer.status, answer.code, answer.headers['x-should-retry']]).toEqual([500, 'non_finite_output', 'false']);
      expect(answer.message).toMatch(/^Model 'demo' failed to make this image: its denoiser's latents held NaN or infinite values after the last step, so the picture would have been black\..* Try a lower guidance_scale, or an fp32 export of the model\.$/);
      await expect(pool.generate(demoBatch({ width, height, steps: 2 }))).resolves.toHaveLength(1);
    });
  });
});
