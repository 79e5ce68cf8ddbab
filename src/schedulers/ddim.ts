import type { BatchNoise } from '../runtime/random.js';
import type { SchedulerEntry } from './index.js';
import {
  checkPredictionType,
  DDPM_TRAINING_DEFAULTS,
  clampInPlace,
  epsilonCoefficients,
  rejectUnsupported,
  roundHalfEven,
  spacedTimesteps,
  trainingAlphasCumprod,
  vpFromAlphaCumprod,
  weightedSum,
  withDefaults,
  x0Coefficients,
  type PredictionType,
} from './noise-schedule.js';
import { AlphaSpaceScheduler } from './alpha-space.js';
import type { SchedulerConfig } from './scheduler.js';

const CLASS_NAME = 'DDIMScheduler';

const DEFAULTS = {
  ...DDPM_TRAINING_DEFAULTS,
  clip_sample: true,
  set_alpha_to_one: true,
  steps_offset: 0,
  prediction_type: 'epsilon',
  clip_sample_range: 1,
  timestep_spacing: 'leading',
};

/** DDIMScheduler (Song et al. 2020) with eta = 0: the deterministic implicit sampler. */
export class DDIMScheduler extends AlphaSpaceScheduler {
  private readonly config: typeof DEFAULTS & SchedulerConfig;
  private readonly predictionType: PredictionType;
  protected readonly alphasCumprod: Float32Array;
  /** abar "after" the last step: 1 lands on a clean x0, abar_0 stops one training step short. */
  private readonly finalAlphaCumprod: number;
  private stepRatio = 0;

  constructor(config: SchedulerConfig = {}) {
    super();
    this.config = withDefaults(DEFAULTS, config);
    rejectUnsupported(CLASS_NAME, this.config, { thresholding: false });
    this.predictionType = checkPredictionType(CLASS_NAME, this.config.prediction_type, ['epsilon', 'v_prediction', 'sample']);
    this.alphasCumprod = trainingAlphasCumprod(this.config);
    this.finalAlphaCumprod = this.config.set_alpha_to_one ? 1 : this.alphasCumprod[0];
  }

  setTimesteps(numInferenceSteps: number): void {
    const T = this.config.num_train_timesteps;
    if (numInferenceSteps > T) throw new Error(`${CLASS_NAME}: at most ${T} steps`);
    this.stepRatio = Math.floor(T / numInferenceSteps);
    this.schedule = spacedTimesteps(this.config.timestep_spacing, T, numInferenceSteps, this.config.steps_offset).map(roundHalfEven);
    this.checkPredictable(CLASS_NAME, this.predictionType);
  }

  step(modelOutput: Float32Array, index: number, sample: Float32Array, _noise: BatchNoise): Float32Array {
    if (this.stepRatio === 0) throw new Error(`${CLASS_NAME}: call setTimesteps before step`);
    const t = this.schedule[index];
    // diffusers steps back by T // N whatever the spacing, not to the next scheduled timestep.
    const prevT = t - this.stepRatio;
    const vp = vpFromAlphaCumprod(this.alphasCumprod[t]);
    const aPrev = prevT >= 0 ? this.alphasCumprod[prevT] : this.finalAlphaCumprod;

    const [x0Sample, x0Output] = x0Coefficients(this.predictionType, vp);
    const x0 = weightedSum([
      [x0Sample, sample],
      [x0Output, modelOutput],
    ]);
    if (this.config.clip_sample) clampInPlace(x0, this.config.clip_sample_range);
    // eps stays the model's own prediction even when x0 was clipped (use_clipped_model_output off).
    const [epsSample, epsOutput] = epsilonCoefficients(this.predictionType, vp);
    const direction = Math.sqrt(1 - aPrev);
    return weightedSum([
      [Math.sqrt(aPrev), x0],
      [direction * epsSample, sample],
      [direction * epsOutput, modelOutput],
    ]);
  }
}

export const ddim: SchedulerEntry = {
  className: CLASS_NAME,
  kind: 'vp',
  names: { ddim: {} },
  create: (config) => new DDIMScheduler(config),
};
