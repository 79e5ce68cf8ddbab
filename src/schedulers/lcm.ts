import type { BatchNoise } from '../runtime/random.js';
import type { SchedulerEntry } from './index.js';
import {
  checkPredictionType,
  clampInPlace,
  linspace,
  noiseLike,
  rejectUnsupported,
  trainingAlphasCumprod,
  vpFromAlphaCumprod,
  weightedSum,
  withDefaults,
  x0Coefficients,
  type PredictionType,
} from './noise-schedule.js';
import { AlphaSpaceScheduler } from './alpha-space.js';
import type { SchedulerConfig, SetTimestepsOptions } from './scheduler.js';

const CLASS_NAME = 'LCMScheduler';

const DEFAULTS = {
  num_train_timesteps: 1000,
  beta_start: 0.00085,
  beta_end: 0.012,
  beta_schedule: 'scaled_linear',
  trained_betas: null as number[] | null,
  original_inference_steps: 50,
  clip_sample: false,
  clip_sample_range: 1,
  set_alpha_to_one: true,
  steps_offset: 0,
  prediction_type: 'epsilon',
  timestep_spacing: 'leading',
  timestep_scaling: 10,
};

/** sigma_data of the consistency-model boundary condition (Song et al. 2023). */
const SIGMA_DATA = 0.5;

/**
 * LCMScheduler (Latent Consistency Models, Luo et al. 2023): every call predicts the clean sample
 * directly; between calls the prediction is re-noised to the next timestep with fresh noise.
 */
export class LCMScheduler extends AlphaSpaceScheduler {
  private readonly config: typeof DEFAULTS & SchedulerConfig;
  private readonly predictionType: PredictionType;
  protected readonly alphasCumprod: Float32Array;

  constructor(config: SchedulerConfig = {}) {
    super();
    this.config = withDefaults(DEFAULTS, config);
    rejectUnsupported(CLASS_NAME, this.config, { thresholding: false });
    this.predictionType = checkPredictionType(CLASS_NAME, this.config.prediction_type, ['epsilon', 'v_prediction', 'sample']);
    this.alphasCumprod = trainingAlphasCumprod(this.config);
  }

  /**
   * Picks N of the `original_inference_steps` timesteps the model was distilled on (k = T // 50: 999,
   * 979, ...). With a `strength` (LCM's own image-to-image pipeline) only the first
   * int(original_inference_steps x strength) of them, the least noisy, are picked from.
   */
  setTimesteps(numInferenceSteps: number, { strength = 1 }: SetTimestepsOptions = {}): void {
    const { num_train_timesteps: T, original_inference_steps: original } = this.config;
    if (original > T) throw new Error(`${CLASS_NAME}: original_inference_steps ${original} exceeds ${T} training steps`);
    // Products in double precision and truncated, as Python's int(original * strength).
    const usable = Math.trunc(original * strength);
    if (numInferenceSteps < 1 || numInferenceSteps > usable) {
      const bound = strength === 1 ? `original_inference_steps (${original})` : `${usable}, the distilled timesteps strength ${strength} leaves of original_inference_steps (${original})`;
      throw new Error(`${CLASS_NAME}: steps must be between 1 and ${bound}`);
    }
    const k = Math.floor(T / original);
    const distilled = Array.from({ length: usable }, (_, i) => (usable - i) * k - 1);
    // numpy.linspace(0, len, N, endpoint=False), floored.
    this.schedule = linspace(0, usable, numInferenceSteps + 1)
      .slice(0, -1)
      .map((position) => distilled[Math.floor(position)]);
    this.checkPredictable(CLASS_NAME, this.predictionType);
  }

  step(modelOutput: Float32Array, index: number, sample: Float32Array, noise: BatchNoise): Float32Array {
    if (this.schedule.length === 0) throw new Error(`${CLASS_NAME}: call setTimesteps before step`);
    const t = this.schedule[index];
    const vp = vpFromAlphaCumprod(this.alphasCumprod[t]);
    const [cSample, cOutput] = x0Coefficients(this.predictionType, vp);
    const x0 = weightedSum([
      [cSample, sample],
      [cOutput, modelOutput],
    ]);
    if (this.config.clip_sample) clampInPlace(x0, this.config.clip_sample_range);

    // Consistency boundary condition: c_skip -> 1 and c_out -> 0 as t -> 0, so f(x, 0) = x.
    const scaled = t * this.config.timestep_scaling;
    const cSkip = SIGMA_DATA ** 2 / (scaled * scaled + SIGMA_DATA ** 2);
    const cOut = scaled / Math.sqrt(scaled * scaled + SIGMA_DATA ** 2);
    const denoised = weightedSum([
      [cOut, x0],
      [cSkip, sample],
    ]);
    if (index === this.schedule.length - 1) return denoised;

    // Multistep LCM: jump back up to the next timestep with fresh noise.
    const next = vpFromAlphaCumprod(this.alphasCumprod[this.schedule[index + 1]]);
    return weightedSum([
      [next.alpha, denoised],
      [next.sigma, noiseLike(noise, denoised)],
    ]);
  }
}

export const lcm: SchedulerEntry = {
  className: CLASS_NAME,
  kind: 'vp',
  names: { lcm: {} },
  create: (config) => new LCMScheduler(config),
};
