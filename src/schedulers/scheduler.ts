import type { BatchNoise } from '../runtime/random.js';

/** 'vp': noise-prediction diffusion (SD 1.x/2.x, SDXL, LCM); 'flow': rectified flow (FLUX). */
export type ModelKind = 'vp' | 'flow';

/** The fields of diffusers' `scheduler/scheduler_config.json` that our schedulers read. */
export interface SchedulerConfig {
  _class_name?: string;
  num_train_timesteps?: number;
  beta_start?: number;
  beta_end?: number;
  beta_schedule?: 'linear' | 'scaled_linear' | 'squaredcos_cap_v2' | string;
  trained_betas?: number[] | null;
  /** Zero terminal SNR (noise-schedule.ts's zeroTerminalSnr): SD 2.1 fine-tunes that make very dark and bright pictures. */
  rescale_betas_zero_snr?: boolean;
  prediction_type?: 'epsilon' | 'v_prediction' | 'sample' | string;
  timestep_spacing?: 'leading' | 'trailing' | 'linspace' | string;
  steps_offset?: number;
  set_alpha_to_one?: boolean;
  skip_prk_steps?: boolean;
  clip_sample?: boolean;
  clip_sample_range?: number;
  use_karras_sigmas?: boolean;
  interpolation_type?: string;
  final_sigmas_type?: 'zero' | 'sigma_min' | string;
  solver_order?: number;
  algorithm_type?: string;
  solver_type?: string;
  lower_order_final?: boolean;
  original_inference_steps?: number;
  timestep_scaling?: number;
  // flow matching
  shift?: number;
  use_dynamic_shifting?: boolean;
  base_shift?: number;
  max_shift?: number;
  base_image_seq_len?: number;
  max_image_seq_len?: number;
  [key: string]: unknown;
}

export interface SetTimestepsOptions {
  /** Flow matching with dynamic shifting: mu computed by the pipeline from the image's sequence length. */
  mu?: number;
  /**
   * Image-to-image's strength, for a scheduler that picks its timesteps by it (LCM, as its own
   * image-to-image pipeline asks: strength.ts's 'consistency' rule); others ignore it.
   */
  strength?: number;
}

/**
 * A sampler in the diffusers sense: it owns the timestep schedule and the update rule, and knows
 * nothing about the model. Tensors are flat Float32Arrays holding the whole batch.
 *
 * Usage per generation:
 *   s.setTimesteps(steps); x = noise * s.initNoiseSigma;
 *   (image-to-image: i0 = strengthStart(steps, strength, rule); x = s.addNoise(image latents, noise, i0))
 *   for (i = 0 (or i0); i < s.timesteps.length; i++) {
 *     out = model(s.scaleModelInput(x, i), s.timesteps[i]); x = s.step(out, i, x, noise);
 *   }
 */
export interface Scheduler {
  /** The timesteps handed to the model, one per model call (PNDM repeats one). */
  readonly timesteps: readonly number[];
  /** Multiplier for the initial Gaussian latents. */
  readonly initNoiseSigma: number;
  setTimesteps(numInferenceSteps: number, options?: SetTimestepsOptions): void;
  /** The model input for call `index` (Euler-type schedulers divide by sqrt(sigma^2 + 1)). */
  scaleModelInput(sample: Float32Array, index: number): Float32Array;
  /**
   * A clean sample taken to the noise level of call `index` (diffusers' add_noise; scale_noise for flow
   * matching): where image-to-image starts, then denoised from call `index` on.
   */
  addNoise(original: Float32Array, noise: Float32Array, index: number): Float32Array;
  /** One update: returns the sample for the next call (a new array). */
  step(modelOutput: Float32Array, index: number, sample: Float32Array, noise: BatchNoise): Float32Array;
}
