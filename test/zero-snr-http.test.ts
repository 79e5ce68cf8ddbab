import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { apiError } from './helpers/failures.js';
import { readImageFile } from './helpers/picture.js';
import { installModels, startRealServer, type RealServer } from './helpers/real-server.js';
import { referenceModel } from './helpers/reference.js';

/**
 * A zero-terminal-SNR fine-tune of SD 2.1 as users install one: v-prediction, DDIM with trailing
 * spacing and rescale_betas_zero_snr in its scheduler_config.json, guidance_rescale 0.7 in its
 * imagegen.json. It loads and draws through the real HTTP route with the official SDK, with its own
 * scheduler and with the Euler-type ones (which start at sigma ~4096); PNDM, which diffusers runs
 * without the option, is neither listed nor run, and a request for it is told why. The reference denoiser was made for SD's plain
 * schedule, which the rescaled one follows but for its noisiest steps: the picture must still be the
 * prompt's, and another than the same folder draws without the option.
 */

const [MODEL, PLAIN] = ['sd21-zsnr', 'sd21-trailing'];
let root: string;
let real: RealServer;

beforeAll(async () => {
  root = await mkdtemp(path.join(os.tmpdir(), 'imagegen-zero-snr-'));
  const models = path.join(root, 'models');
  await installModels(models, { [MODEL]: { copy: referenceModel('sd2-v'), preset: { guidance_rescale: 0.7 } }, [PLAIN]: { copy: referenceModel('sd2-v'), preset: { guidance_rescale: 0.7 } } });
  for (const [id, rescale] of [[MODEL, true], [PLAIN, false]] as const) {
    const file = path.join(models, id, 'scheduler', 'scheduler_config.json');
    const config = JSON.parse(await readFile(file, 'utf8')) as Record<string, unknown>;
    await writeFile(file, JSON.stringify({ ...config, timestep_spacing: 'trailing', rescale_betas_zero_snr: rescale }));
  }
  real = await startRealServer({ root, env: { WORKERS: '1', PRELOAD: 'none' } });
});

afterAll(async () => {
  await real?.close();
  await rm(root, { recursive: true, force: true });
});

const generate = (params: Record<string, unknown>) =>
  real.client.images.generate({ model: MODEL, size: '768x768', response_format: 'b64_json', seed: 11, steps: 20, ...params } as unknown as OpenAI.ImageGenerateParamsNonStreaming);

describe('a model whose scheduler_config.json sets rescale_betas_zero_snr', () => {
  it('draws what the prompt asks with its own DDIM and with the Euler-type schedulers', async () => {
    for (const [scheduler, prompt, colour, shape] of [
      [undefined, 'a red circle', 'red', 'circle'],
      ['euler', 'a blue square', 'blue', 'square'],
      ['dpmpp_2m', 'a green triangle', 'green', 'triangle'],
    ] as const) {
      const res = await generate({ prompt, ...(scheduler && { scheduler }) });
      const { info, reading } = await readImageFile(Buffer.from(res.data![0].b64_json!, 'base64'));
      expect([`${info.width}x${info.height}`, reading.colour, reading.shape], scheduler ?? 'ddim').toEqual(['768x768', colour, shape]);
    }
    // The option reaches the worker's scheduler: the same folder without it draws another picture.
    const [rescaled, plain] = await Promise.all([MODEL, PLAIN].map((model) => generate({ model, prompt: 'a red circle' })));
    expect(rescaled.data![0].b64_json).not.toBe(plain.data![0].b64_json);
  });

  it('lists and runs no PNDM, which diffusers runs without the option: a request for it is a 400 saying why, and naming those it runs', async () => {
    const listed = (await real.client.models.retrieve(MODEL)) as unknown as { schedulers: string[] };
    expect(listed.schedulers).toEqual(['ddim', 'euler', 'euler_a', 'dpmpp_2m', 'dpmpp_2m_karras', 'lcm']);
    const error = await apiError(generate({ prompt: 'a red circle', scheduler: 'pndm' }), OpenAI.BadRequestError);
    expect(error).toMatchObject({ status: 400, param: 'scheduler', code: 'invalid_value' });
    expect(error.message).toContain(
      "Invalid value: 'pndm'. Model 'sd21-zsnr' cannot run it with its scheduler_config.json: PNDMScheduler: rescale_betas_zero_snr=true is not supported. " +
        "Supported values for model 'sd21-zsnr' are: 'ddim', 'euler'",
    );
    // A scheduler of another kind of model is not one its config refuses: the 400 names those it runs, no reason.
    const flow = await apiError(generate({ prompt: 'a red circle', scheduler: 'flow_match_euler' }), OpenAI.BadRequestError);
    expect(flow.message).toContain("Invalid value: 'flow_match_euler'. Supported values for model 'sd21-zsnr' are: 'ddim', ");
  });
});
