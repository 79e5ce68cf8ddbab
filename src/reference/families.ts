/**
 * The reference model families as data: each mirrors one real export's folder layout, tensor
 * signatures, tokenizer files and scheduler configuration (see shared/reference/diffusion-onnx.md).
 * build.ts turns a spec into files; nothing here is code per family.
 */
import { EOS } from './clip-vocabulary.js';
import type { ClipPadToken, ClipTokenizerFormat } from './tokenizer-files.js';
import type { DType } from './onnx-graph.js';

export interface ClipEncoderSpec {
  kind: 'clip';
  folder: 'text_encoder' | 'text_encoder_2';
  tokenizerFolder: 'tokenizer' | 'tokenizer_2';
  hidden: number;
  pad: ClipPadToken;
  /** CLIPTextModelWithProjection (SDXL's second encoder). */
  projection?: boolean;
}

export interface T5EncoderSpec {
  kind: 't5';
  folder: 'text_encoder_2';
  tokenizerFolder: 'tokenizer_2';
  hidden: number;
  maxLength: number;
}

export interface UnetSpec {
  kind: 'unet';
  /** Default latent size in unet/config.json (image side / 8). */
  sampleSize: number;
  timestep: { dtype: DType; rank: 0 | 1 };
  prediction: 'epsilon' | 'v_prediction';
  /** LCM's timestep_cond width. */
  timestepCondDim?: number;
  /** An inpainting UNet (in_channels 9: the mask and the masked picture's latents after the sample). */
  inpainting?: boolean;
}

export interface FluxSpec {
  kind: 'flux';
  /** FLUX-dev's distilled guidance input. */
  guidance: boolean;
}

export interface FamilySpec {
  name: string;
  /**
   * `legacy`: diffusers' old conversion script (int32 ids, float timestep [batch], unet/weights.pb, VAE
   * encoder output latent_sample, no config.json files). `optimum`: Optimum (int64 ids, model.onnx_data,
   * latent_parameters, a config.json per component, the original pipeline's model_index.json).
   */
  exporter: 'legacy' | 'optimum';
  /** model_index.json `_class_name`. */
  pipelineClass: string;
  /** Extra model_index.json fields. */
  pipelineFields: Record<string, unknown>;
  /** Dtype of every float input and output. */
  float: 'float32' | 'float16';
  clipTokenizer: ClipTokenizerFormat;
  /** Two CLIP encoders make an SDXL-style model (hidden_states outputs, text_embeds). */
  encoders: Array<ClipEncoderSpec | T5EncoderSpec>;
  denoiser: UnetSpec | FluxSpec;
  vae: { channels: number; scalingFactor: number; shiftFactor?: number };
  /** scheduler_config.json (less `_diffusers_version`). */
  scheduler: { _class_name: string } & Record<string, unknown>;
}

const SD_BETAS = { beta_end: 0.012, beta_schedule: 'scaled_linear', beta_start: 0.00085, num_train_timesteps: 1000, trained_betas: null };
const SD_VAE = { channels: 4, scalingFactor: 0.18215 };
/** SD 1.x/2.x pipelines without a safety checker. */
const NO_SAFETY_CHECKER = { feature_extractor: [null, null], requires_safety_checker: false, safety_checker: [null, null] };

const CLIP_L: ClipEncoderSpec = { kind: 'clip', folder: 'text_encoder', tokenizerFolder: 'tokenizer', hidden: 16, pad: EOS };
const EULER = {
  _class_name: 'EulerDiscreteScheduler',
  ...SD_BETAS,
  interpolation_type: 'linear',
  prediction_type: 'epsilon',
  steps_offset: 1,
  timestep_spacing: 'leading',
  use_karras_sigmas: false,
};

const SD15_OPTIMUM: FamilySpec = {
  name: 'sd15-optimum',
  exporter: 'optimum',
  pipelineClass: 'StableDiffusionPipeline',
  pipelineFields: NO_SAFETY_CHECKER,
  float: 'float32',
  clipTokenizer: 'slow+fast',
  encoders: [CLIP_L],
  denoiser: { kind: 'unet', sampleSize: 64, timestep: { dtype: 'float32', rank: 0 }, prediction: 'epsilon' },
  vae: SD_VAE,
  scheduler: EULER,
};

const FLUX_SCHNELL: FamilySpec = {
  name: 'flux-schnell',
  exporter: 'optimum',
  pipelineClass: 'FluxPipeline',
  pipelineFields: {},
  float: 'float32',
  clipTokenizer: 'slow+fast',
  // T5 is wider than CLIP, as T5-XXL (4096) is wider than CLIP-L (768), so swapped inputs fail.
  encoders: [CLIP_L, { kind: 't5', folder: 'text_encoder_2', tokenizerFolder: 'tokenizer_2', hidden: 32, maxLength: 256 }],
  denoiser: { kind: 'flux', guidance: false },
  vae: { channels: 16, scalingFactor: 0.3611, shiftFactor: 0.1159 },
  scheduler: {
    _class_name: 'FlowMatchEulerDiscreteScheduler',
    base_image_seq_len: 256,
    base_shift: 0.5,
    max_image_seq_len: 4096,
    max_shift: 1.15,
    num_train_timesteps: 1000,
    shift: 1.0,
    use_dynamic_shifting: false,
  },
};

const FAMILY_SPECS: readonly FamilySpec[] = [
  {
    ...SD15_OPTIMUM,
    name: 'sd15-legacy',
    exporter: 'legacy',
    pipelineClass: 'OnnxStableDiffusionPipeline',
    clipTokenizer: 'slow',
    denoiser: { kind: 'unet', sampleSize: 64, timestep: { dtype: 'float32', rank: 1 }, prediction: 'epsilon' },
    scheduler: {
      _class_name: 'PNDMScheduler',
      ...SD_BETAS,
      clip_sample: false,
      set_alpha_to_one: false,
      skip_prk_steps: true,
      steps_offset: 1,
    },
  },
  SD15_OPTIMUM,
  {
    ...SD15_OPTIMUM,
    name: 'sd15-inpainting',
    pipelineClass: 'StableDiffusionInpaintPipeline',
    denoiser: { ...SD15_OPTIMUM.denoiser, inpainting: true } as UnetSpec,
  },
  {
    ...SD15_OPTIMUM,
    name: 'sd15-fp16',
    float: 'float16',
    denoiser: { kind: 'unet', sampleSize: 64, timestep: { dtype: 'float16', rank: 0 }, prediction: 'epsilon' },
  },
  {
    ...SD15_OPTIMUM,
    name: 'sd2-v',
    encoders: [{ ...CLIP_L, pad: '!' }],
    denoiser: { kind: 'unet', sampleSize: 96, timestep: { dtype: 'int64', rank: 1 }, prediction: 'v_prediction' },
    scheduler: {
      _class_name: 'DDIMScheduler',
      ...SD_BETAS,
      clip_sample: false,
      prediction_type: 'v_prediction',
      set_alpha_to_one: false,
      skip_prk_steps: true,
      steps_offset: 1,
      timestep_spacing: 'leading',
    },
  },
  {
    ...SD15_OPTIMUM,
    name: 'sd-turbo',
    clipTokenizer: 'fast',
    encoders: [{ ...CLIP_L, pad: '!' }],
    // Meant for 1-4 steps without guidance.
    scheduler: { ...EULER, _class_name: 'EulerAncestralDiscreteScheduler', timestep_spacing: 'trailing' },
  },
  {
    ...SD15_OPTIMUM,
    name: 'sdxl',
    pipelineClass: 'StableDiffusionXLPipeline',
    pipelineFields: { feature_extractor: [null, null], force_zeros_for_empty_prompt: true, image_encoder: [null, null] },
    // The second encoder is wider, as OpenCLIP bigG (1280) is wider than CLIP-L (768).
    encoders: [CLIP_L, { kind: 'clip', folder: 'text_encoder_2', tokenizerFolder: 'tokenizer_2', hidden: 32, pad: '!', projection: true }],
    denoiser: { kind: 'unet', sampleSize: 128, timestep: { dtype: 'float32', rank: 0 }, prediction: 'epsilon' },
    vae: { channels: 4, scalingFactor: 0.13025 },
  },
  {
    ...SD15_OPTIMUM,
    name: 'lcm',
    pipelineClass: 'LatentConsistencyModelPipeline',
    denoiser: { kind: 'unet', sampleSize: 64, timestep: { dtype: 'float32', rank: 0 }, prediction: 'epsilon', timestepCondDim: 256 },
    scheduler: {
      _class_name: 'LCMScheduler',
      ...SD_BETAS,
      clip_sample: false,
      clip_sample_range: 1.0,
      original_inference_steps: 50,
      prediction_type: 'epsilon',
      rescale_betas_zero_snr: false,
      set_alpha_to_one: true,
      steps_offset: 1,
      thresholding: false,
      timestep_scaling: 10.0,
      timestep_spacing: 'leading',
    },
  },
  FLUX_SCHNELL,
  {
    ...FLUX_SCHNELL,
    name: 'flux-dev',
    encoders: [CLIP_L, { kind: 't5', folder: 'text_encoder_2', tokenizerFolder: 'tokenizer_2', hidden: 32, maxLength: 512 }],
    denoiser: { kind: 'flux', guidance: true },
    scheduler: { ...FLUX_SCHNELL.scheduler, shift: 3.0, use_dynamic_shifting: true },
  },
];

export const REFERENCE_FAMILIES: readonly string[] = FAMILY_SPECS.map((spec) => spec.name);

export function familySpec(name: string): FamilySpec {
  const spec = FAMILY_SPECS.find((s) => s.name === name);
  if (!spec) throw new Error(`unknown reference family "${name}" (known: ${REFERENCE_FAMILIES.join(', ')})`);
  return spec;
}
