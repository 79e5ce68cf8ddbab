import { cp, readFile, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import OpenAI, { toFile } from 'openai';
import sharp from 'sharp';
import { describe, expect, it } from 'vitest';
import { FAMILIES } from '../src/families/index.js';
import { inspectModelFolder } from '../src/models/model-folder.js';
import { REFERENCE_FAMILIES } from '../src/reference/index.js';
import { startTestServer } from './helpers/api-server.js';
import { apiError } from './helpers/failures.js';
import { haveRealExports, REAL_EXPORT_NAMES, realExport } from './helpers/real-exports.js';
import { copyOfReference, referenceModel } from './helpers/reference.js';

/**
 * The model-family registry (src/families/): every reference family and real export is recognised as
 * the family and variant it is, by exactly one entry (a second would be an error), and a folder of a
 * family the server does not run is refused by name rather than run as a family it resembles.
 */

/** What each reference family (src/reference/families.ts) is: a new one fails here until it is listed. */
const REFERENCE: Record<string, [family: string, variant: string]> = {
  'sd15-legacy': ['sd', 'sd15'],
  'sd15-optimum': ['sd', 'sd15'],
  'sd15-fp16': ['sd', 'sd15'],
  'sd15-inpainting': ['sd', 'sd15'],
  'sd2-v': ['sd', 'sd2'],
  'sd-turbo': ['sd', 'sd-turbo'],
  sdxl: ['sdxl', 'sdxl'],
  lcm: ['sd', 'lcm'],
  'flux-schnell': ['flux', 'flux-schnell'],
  'flux-dev': ['flux', 'flux-dev'],
};

const REAL: Record<(typeof REAL_EXPORT_NAMES)[number], [family: string, variant: string]> = {
  sd15: ['sd', 'sd15'],
  sd2v: ['sd', 'sd2'],
  sdxl: ['sdxl', 'sdxl'],
  flux: ['flux', 'flux-schnell'],
};

/** A copy of the reference model `reference` whose JSON file `file` (relative to its folder) has `fields` set over its own. */
async function copyWith(reference: string, file: string, fields: Record<string, unknown>): Promise<string> {
  const dir = await copyOfReference(reference);
  const at = path.join(dir, file);
  await writeFile(at, JSON.stringify({ ...JSON.parse(await readFile(at, 'utf8')), ...fields }));
  return dir;
}

async function familyOf(dir: string): Promise<[string, string] | string> {
  const verdict = await inspectModelFolder(dir);
  return verdict.usable ? [verdict.layout.family, verdict.layout.variant] : verdict.reason;
}

describe('the model-family registry', () => {
  it('has one entry per name, each with a preset for every variant it names', () => {
    expect(new Set(FAMILIES.map((f) => f.name)).size).toBe(FAMILIES.length);
    for (const family of FAMILIES) {
      for (const preset of Object.values(family.variants)) expect(preset.steps.low).toBeLessThanOrEqual(preset.steps.standard);
      if (family.secondEncoderLength) expect(Object.keys(family.secondEncoderLength).sort()).toEqual(Object.keys(family.variants).sort());
    }
  });

  it('recognises every reference family as what it is', async () => {
    expect(Object.keys(REFERENCE).sort()).toEqual([...REFERENCE_FAMILIES].sort());
    for (const name of REFERENCE_FAMILIES) expect([name, await familyOf(referenceModel(name))]).toEqual([name, REFERENCE[name]]);
  });

  it.skipIf(!haveRealExports)('recognises every real export as what it is (needs ../shared)', async () => {
    for (const name of REAL_EXPORT_NAMES) expect([name, await familyOf(realExport(name))]).toEqual([name, REAL[name]]);
  });

  it("takes trailing spacing that comes with a zero-terminal-SNR schedule for a full-length fine-tune, not a turbo model: it keeps its base's steps and guidance", async () => {
    // Lin et al. 2023 pair rescale_betas_zero_snr with trailing spacing for sampling at the usual step
    // counts (diffusers' docs set both on SD 2.1's DDIM); SD-Turbo and SDXL-Turbo ship trailing without it.
    const withSchedule = async (reference: string, fields: Record<string, unknown>) => familyOf(await copyWith(reference, 'scheduler/scheduler_config.json', fields));
    const zeroSnr = { timestep_spacing: 'trailing', rescale_betas_zero_snr: true, prediction_type: 'v_prediction' };
    expect(await withSchedule('sd2-v', zeroSnr)).toEqual(['sd', 'sd2']);
    expect(await withSchedule('sdxl', zeroSnr)).toEqual(['sdxl', 'sdxl']);
    // Trailing spacing alone still says turbo, as the turbo models' own configs have it.
    expect(await withSchedule('sdxl', { timestep_spacing: 'trailing', rescale_betas_zero_snr: false })).toEqual(['sdxl', 'sdxl-turbo']);
  });

  it("tells a latent consistency model distilled with the guidance as an input from an LCM-LoRA fused into a UNet, and runs the LoRA without a classifier-free batch", async () => {
    const defaults = async (dir: string) => {
      const verdict = await inspectModelFolder(dir);
      if (!verdict.usable) throw new Error(verdict.reason);
      return { variant: `${verdict.layout.family}/${verdict.layout.variant}`, steps: verdict.preset.steps.standard, guidance: verdict.preset.guidanceScale };
    };
    // An LCM-LoRA fused into SD 1.5's or SDXL's UNet, saved with LCMScheduler (diffusers' LCM-LoRA guide):
    // a distilled LCM's w of 8.5 here would be classifier-free guidance, a burnt picture at twice the work.
    const lora = { _class_name: 'LCMScheduler' };
    expect(await defaults(await copyWith('sd15-optimum', 'scheduler/scheduler_config.json', lora))).toEqual({ variant: 'sd/lcm-lora', steps: 4, guidance: { vivid: 1, natural: 1 } });
    expect(await defaults(await copyWith('sdxl', 'scheduler/scheduler_config.json', lora))).toEqual({ variant: 'sdxl/sdxl-lcm-lora', steps: 4, guidance: { vivid: 1, natural: 1 } });
    // Distilled (latent-consistency/lcm-sdxl: its UNet embeds the guidance): four steps at its card's w of 8, not SDXL's thirty.
    expect(await defaults(await copyWith('sdxl', 'unet/config.json', { time_cond_proj_dim: 256 }))).toEqual({ variant: 'sdxl/sdxl-lcm', steps: 4, guidance: { vivid: 8, natural: 6 } });
    expect(await defaults(referenceModel('lcm'))).toEqual({ variant: 'sd/lcm', steps: 4, guidance: { vivid: 8.5, natural: 6 } });
  });

  it('refuses an SD3-style folder (a transformer, a third text encoder) by name rather than run it as FLUX', async () => {
    const dir = await copyOfReference('flux-schnell');
    const config = JSON.parse(await readFile(path.join(dir, 'transformer', 'config.json'), 'utf8'));
    await writeFile(path.join(dir, 'transformer', 'config.json'), JSON.stringify({ ...config, _class_name: 'SD3Transformer2DModel' }));
    const index = JSON.parse(await readFile(path.join(dir, 'model_index.json'), 'utf8'));
    await writeFile(path.join(dir, 'model_index.json'), JSON.stringify({ ...index, _class_name: 'StableDiffusion3Pipeline' }));
    expect(await familyOf(dir)).toMatch(
      /^no model family here recognises it \(transformer\/config\.json names SD3Transformer2DModel, model_index\.json names StableDiffusion3Pipeline\); this server runs sd, sdxl, flux models/,
    );

    // Without class names (no configs), its third text encoder still tells it apart.
    await rm(path.join(dir, 'transformer', 'config.json'));
    await rm(path.join(dir, 'model_index.json'));
    await cp(path.join(dir, 'text_encoder_2'), path.join(dir, 'text_encoder_3'), { recursive: true });
    expect(await familyOf(dir)).toMatch(/^no model family here recognises it \(it has transformer\/ but no class names\)/);
  });

  it("gives a model its family's capabilities, less editing when its export lacks the VAE encoder", async () => {
    const full = await inspectModelFolder(referenceModel('sd15-optimum'));
    expect(full.usable && full.capabilities).toEqual(['text-to-image', 'image-to-image', 'inpainting', 'previews']);
    const dir = await copyOfReference('sd15-optimum');
    await rm(path.join(dir, 'vae_encoder'), { recursive: true });
    const partial = await inspectModelFolder(dir);
    expect(partial.usable && partial.capabilities).toEqual(['text-to-image', 'previews']);
  });

  it('refuses an edit for a model that lacks the capability with a 400 that says why', async () => {
    // The test server's model is the demo model without its vae_encoder: it can draw, not edit.
    const server = await startTestServer();
    try {
      const png = await sharp({ create: { width: 64, height: 64, channels: 3, background: 'red' } }).png().toBuffer();
      const error = await apiError(server.client.images.edit({ model: 'stub', prompt: 'a blue square', image: await toFile(png, 'in.png', { type: 'image/png' }) }), OpenAI.BadRequestError);
      expect(error).toMatchObject({ status: 400, param: 'model', code: 'unsupported_value' });
      expect(error.message).toMatch(/The model 'stub' cannot edit images: its export \(stub\) lacks vae_encoder\/model\.onnx/);
      // A client can tell beforehand: the model's entry lists what it can do, and its samplers.
      const listed = (await server.client.models.retrieve('stub')) as OpenAI.Model & { capabilities: string[]; schedulers: string[] };
      expect(listed.capabilities).toEqual(['text-to-image', 'previews']);
      expect(listed.schedulers.length).toBeGreaterThan(0);
    } finally {
      await server.close();
    }
  });
});
