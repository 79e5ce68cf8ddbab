import { access, readdir } from 'node:fs/promises';
import path from 'node:path';
import { createScheduler } from '../schedulers/index.js';
import type { SchedulerConfig } from '../schedulers/scheduler.js';
import { findTokenizerSource, TokenizerFilesError } from '../tokenizers/files.js';
import { readJsonIfPresent } from '../util/files.js';
import { externalDataProblem } from './onnx-external-data.js';
import { isTensorRtEngine, tensorRtProblem } from './tensorrt.js';

/**
 * Recognises a model folder in any of the export conventions (legacy diffusers script, Optimum) by
 * probing for component folders rather than trusting `model_index.json`, whose component names differ
 * between exporters (Optimum keeps the original pipeline's `vae`).
 */

export type ModelFamily = 'sd' | 'sdxl' | 'flux';
export type ModelVariant = 'sd15' | 'sd2' | 'sd-turbo' | 'sdxl' | 'sdxl-turbo' | 'lcm' | 'flux-schnell' | 'flux-dev';

/**
 * What image sides must be multiples of when a folder's configs do not say (legacy exports have no
 * config.json): a UNet halves the latent grid once per down block after the first and must double it
 * back to the same size to concatenate its skip connections (SD 1/2: 8 x 2^3; SDXL: 8 x 2^2); FLUX
 * packs 2x2 latent patches.
 */
const DEFAULT_SIZE_MULTIPLE: Record<ModelFamily, number> = { sd: 64, sdxl: 32, flux: 16 };

export interface ModelLayout {
  dir: string;
  family: ModelFamily;
  variant: ModelVariant;
  /** Pixel side the denoiser was trained at (`sample_size` x 8), when its config says. */
  nativeSize?: number;
  textEncoder: string;
  textEncoder2?: string;
  /** UNet (SD, SDXL) or transformer (FLUX). */
  denoiser: string;
  vaeDecoder: string;
  /** The VAE encoder, which image-to-image needs (text-to-image does not). */
  vaeEncoder?: string;
  tokenizer: string;
  tokenizer2?: string;
  scheduler: SchedulerConfig;
  /**
   * `scaleFactor`: image pixels per latent pixel along a side (8 for every released VAE).
   * `midBlockAttention`: the decoder attends over every latent pixel (every released VAE does; its
   * config can say `mid_block_add_attention: false`), which sets its memory at large sizes.
   */
  vae: { scalingFactor: number; shiftFactor: number; scaleFactor: number; midBlockAttention: boolean };
  /** Image sides must be multiples of this, or the denoiser's graph fails (see sizeMultiple()). */
  sizeMultiple: number;
  /** Optional `config.json` of the denoiser (Optimum exports have one). */
  denoiserConfig: Record<string, unknown>;
}

export class ModelLayoutError extends Error {
  constructor(
    readonly dir: string,
    /** What is wrong, without the folder: the reason `imagegen models list`, /ready and the log give. */
    readonly problem: string,
  ) {
    super(`${dir} is not a usable model folder: ${problem}`);
    this.name = 'ModelLayoutError';
  }
}

const DEFAULT_VAE: Record<ModelFamily, { scalingFactor: number; shiftFactor: number }> = {
  sd: { scalingFactor: 0.18215, shiftFactor: 0 },
  sdxl: { scalingFactor: 0.13025, shiftFactor: 0 },
  flux: { scalingFactor: 0.3611, shiftFactor: 0.1159 },
};

export async function exists(file: string): Promise<boolean> {
  try {
    await access(file);
    return true;
  } catch {
    return false;
  }
}

/** A config file of the model folder `root`, or undefined when it has none. */
async function readJson(root: string, file: string): Promise<Record<string, unknown> | undefined> {
  try {
    return (await readJsonIfPresent(file)) as Record<string, unknown> | undefined;
  } catch (err) {
    throw new ModelLayoutError(root, (err as Error).message);
  }
}

/** The first of `folders` holding a `model.onnx`. */
async function findOnnx(dir: string, folders: string[]): Promise<string | undefined> {
  for (const folder of folders) {
    const file = path.join(dir, folder, 'model.onnx');
    if (await exists(file)) return file;
  }
  return undefined;
}

/** The tokenizer folder, or undefined when it has no tokenizer; one that lacks a companion file is named at once. */
async function findTokenizer(dir: string, folder: string): Promise<string | undefined> {
  const tokDir = path.join(dir, folder);
  try {
    await findTokenizerSource(tokDir);
    return tokDir;
  } catch (err) {
    if (err instanceof TokenizerFilesError && err.partial) throw new ModelLayoutError(dir, err.message);
    if (err instanceof TokenizerFilesError) return undefined;
    throw err;
  }
}

function classifyVariant(
  family: ModelFamily,
  scheduler: SchedulerConfig,
  denoiserConfig: Record<string, unknown>,
  modelIndex: Record<string, unknown> | undefined,
): ModelVariant {
  const name = String(modelIndex?._name_or_path ?? '').toLowerCase();
  const turbo = name.includes('turbo') || scheduler.timestep_spacing === 'trailing';
  if (family === 'flux') {
    const dev = denoiserConfig.guidance_embeds === true || scheduler.use_dynamic_shifting === true;
    return dev ? 'flux-dev' : 'flux-schnell';
  }
  if (family === 'sdxl') return turbo ? 'sdxl-turbo' : 'sdxl';
  if (scheduler._class_name === 'LCMScheduler' || denoiserConfig.time_cond_proj_dim != null) return 'lcm';
  if (turbo) return 'sd-turbo';
  if (scheduler.prediction_type === 'v_prediction' || denoiserConfig.cross_attention_dim === 1024) return 'sd2';
  return 'sd15';
}

/** 2^(blocks - 1): how often a stack of blocks halves (or doubles) the grid, when a config lists them. */
function halvings(blocks: unknown): number | undefined {
  return Array.isArray(blocks) && blocks.length > 0 ? 2 ** (blocks.length - 1) : undefined;
}

/**
 * The size multiple from the model's own configs, as diffusers computes it: the VAE's scale factor
 * times the UNet's down-sampling (2^(down blocks - 1)), or times FLUX's 2x2 packing and patch size.
 */
function sizeMultiple(family: ModelFamily, vaeScale: number, denoiserConfig: Record<string, unknown>): number {
  if (family === 'flux') {
    const patch = typeof denoiserConfig.patch_size === 'number' ? denoiserConfig.patch_size : 1;
    return vaeScale * 2 * patch;
  }
  const unet = halvings(denoiserConfig.down_block_types);
  return unet === undefined ? DEFAULT_SIZE_MULTIPLE[family] : vaeScale * unet;
}

export async function inspectModel(dir: string): Promise<ModelLayout> {
  const root = path.resolve(dir);
  if (!(await exists(root))) throw new ModelLayoutError(root, 'the folder does not exist');
  const missing: string[] = [];

  const unet = await findOnnx(root, ['unet']);
  const transformer = unet ? undefined : await findOnnx(root, ['transformer']);
  const denoiser = unet ?? transformer;
  if (!denoiser) missing.push('unet/model.onnx or transformer/model.onnx');
  const textEncoder = await findOnnx(root, ['text_encoder']);
  if (!textEncoder) missing.push('text_encoder/model.onnx');
  const textEncoder2 = await findOnnx(root, ['text_encoder_2']);
  const vaeDecoder = await findOnnx(root, ['vae_decoder', 'vae']);
  const vaeEncoder = await findOnnx(root, ['vae_encoder']);
  if (!vaeDecoder) missing.push('vae_decoder/model.onnx');
  const tokenizer = await findTokenizer(root, 'tokenizer');
  if (!tokenizer) missing.push('tokenizer/ (tokenizer.json or vocab.json + merges.txt)');
  const tokenizer2 = textEncoder2 ? await findTokenizer(root, 'tokenizer_2') : undefined;
  if (textEncoder2 && !tokenizer2) missing.push('tokenizer_2/ (text_encoder_2 needs it)');
  const scheduler = await readJson(root, path.join(root, 'scheduler', 'scheduler_config.json'));
  if (!scheduler) missing.push('scheduler/scheduler_config.json');
  if (transformer && !textEncoder2) missing.push('text_encoder_2/model.onnx (FLUX needs its T5 encoder)');
  if (missing.length) {
    const engines = (await readdir(root, { recursive: true })).filter(isTensorRtEngine);
    throw new ModelLayoutError(root, engines.length ? tensorRtProblem(engines) : `missing ${missing.join(', ')}`);
  }
  for (const graph of [textEncoder!, textEncoder2, denoiser!, vaeDecoder!]) {
    const problem = graph && (await externalDataProblem(graph, root));
    if (problem) throw new ModelLayoutError(root, problem);
  }
  try {
    createScheduler(scheduler as SchedulerConfig);
  } catch (err) {
    throw new ModelLayoutError(root, `scheduler/scheduler_config.json: ${(err as Error).message}`);
  }

  const family: ModelFamily = transformer ? 'flux' : textEncoder2 ? 'sdxl' : 'sd';
  const denoiserConfig = (await readJson(root, path.join(path.dirname(denoiser!), 'config.json'))) ?? {};
  const vaeConfig = (await readJson(root, path.join(path.dirname(vaeDecoder!), 'config.json'))) ?? {};
  const modelIndex = await readJson(root, path.join(root, 'model_index.json'));
  const sampleSize = typeof denoiserConfig.sample_size === 'number' ? denoiserConfig.sample_size : undefined;
  const vaeScale = halvings(vaeConfig.block_out_channels) ?? 8;

  return {
    dir: root,
    family,
    variant: classifyVariant(family, scheduler as SchedulerConfig, denoiserConfig, modelIndex),
    nativeSize: family !== 'flux' && sampleSize ? sampleSize * vaeScale : undefined,
    textEncoder: textEncoder!,
    textEncoder2,
    denoiser: denoiser!,
    vaeDecoder: vaeDecoder!,
    vaeEncoder,
    tokenizer: tokenizer!,
    tokenizer2,
    scheduler: scheduler as SchedulerConfig,
    vae: {
      scalingFactor: typeof vaeConfig.scaling_factor === 'number' ? vaeConfig.scaling_factor : DEFAULT_VAE[family].scalingFactor,
      shiftFactor: typeof vaeConfig.shift_factor === 'number' ? vaeConfig.shift_factor : DEFAULT_VAE[family].shiftFactor,
      scaleFactor: vaeScale,
      midBlockAttention: vaeConfig.mid_block_add_attention !== false,
    },
    sizeMultiple: sizeMultiple(family, vaeScale, denoiserConfig),
    denoiserConfig,
  };
}
