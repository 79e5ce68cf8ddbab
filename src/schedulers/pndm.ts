import type { BatchNoise } from '../runtime/random.js';
import type { SchedulerEntry } from './index.js';
import {
  checkPredictionType,
  DDPM_TRAINING_DEFAULTS,
  epsilonCoefficients,
  rejectUnsupported,
  roundHalfEven,
  spacedTimesteps,
  trainingAlphasCumprod,
  vpFromAlphaCumprod,
  weightedSum,
  withDefaults,
  type PredictionType,
} from './noise-schedule.js';
import { AlphaSpaceScheduler } from './alpha-space.js';
import type { SchedulerConfig } from './scheduler.js';

const CLASS_NAME = 'PNDMScheduler';

const DEFAULTS = {
  ...DDPM_TRAINING_DEFAULTS,
  skip_prk_steps: false,
  set_alpha_to_one: false,
  prediction_type: 'epsilon',
  timestep_spacing: 'leading',
  steps_offset: 0,
};

/** Linear multistep weights for 1..4 stored eps (newest first), the Adams-Bashforth coefficients. */
const PLMS_WEIGHTS: readonly (readonly number[])[] = [
  [1],
  [3 / 2, -1 / 2],
  [23 / 12, -16 / 12, 5 / 12],
  [55 / 24, -59 / 24, 37 / 24, -9 / 24],
];

/**
 * PNDMScheduler (Liu et al. 2022, pseudo numerical methods): Runge-Kutta warm-up (PRK) then linear
 * multistep (PLMS). Stable Diffusion 1.x ships with skip_prk_steps, where the warm-up is replaced by
 * one extra model call at the second timestep (N steps = N+1 calls).
 */
export class PNDMScheduler extends AlphaSpaceScheduler {
  private readonly config: typeof DEFAULTS & SchedulerConfig;
  private readonly predictionType: PredictionType;
  protected readonly alphasCumprod: Float32Array;
  private readonly finalAlphaCumprod: number;
  private stepRatio = 0;
  private prkTimesteps: number[] = [];
  /** Raw model outputs of past steps (newest last), the multistep history. */
  private ets: Float32Array[] = [];
  /** The sample the current multi-call step started from. */
  private startSample: Float32Array | null = null;
  /** PRK's running weighted sum of the four stage outputs. */
  private rkSum: Float32Array | null = null;
  /**
   * Calls since setTimesteps (diffusers' `counter`): the warm-up follows the calls made, while the
   * timestep follows the call's index, which image-to-image starts past 0.
   */
  private calls = 0;

  constructor(config: SchedulerConfig = {}) {
    super();
    this.config = withDefaults(DEFAULTS, config);
    // diffusers' PNDMScheduler has no zero-SNR option and would ignore one, sampling another schedule
    // than the model's: its step divides by sqrt(abar_t), which the zero-SNR schedule makes 0.
    rejectUnsupported(CLASS_NAME, this.config, { rescale_betas_zero_snr: false });
    this.predictionType = checkPredictionType(CLASS_NAME, this.config.prediction_type, ['epsilon', 'v_prediction']);
    this.alphasCumprod = trainingAlphasCumprod(this.config);
    this.finalAlphaCumprod = this.config.set_alpha_to_one ? 1 : this.alphasCumprod[0];
  }

  setTimesteps(numInferenceSteps: number): void {
    const { num_train_timesteps: T, skip_prk_steps: skipPrk } = this.config;
    this.stepRatio = Math.floor(T / numInferenceSteps);
    const descending = spacedTimesteps(this.config.timestep_spacing, T, numInferenceSteps, this.config.steps_offset).map(roundHalfEven);
    if (skipPrk) {
      // The second timestep is visited twice: once as the target of the first step, once to
      // average its eps with the first one (a Heun-like start instead of the PRK warm-up).
      this.prkTimesteps = [];
      this.schedule = descending.length > 1 ? [descending[0], descending[1], ...descending.slice(1)] : descending;
    } else {
      if (numInferenceSteps < 4) throw new Error(`${CLASS_NAME}: PRK warm-up needs at least 4 steps (or skip_prk_steps)`);
      // Three RK4 steps between the highest four timesteps: calls at the start, twice at the
      // midpoint, and at the end (which the next step then starts from).
      const half = Math.floor(this.stepRatio / 2);
      this.prkTimesteps = [0, 1, 2].flatMap((k) => {
        const end = descending[k + 1];
        return [descending[k], end + half, end + half, end];
      });
      this.schedule = [...this.prkTimesteps, ...descending.slice(3)];
    }
    this.ets = [];
    this.startSample = null;
    this.rkSum = null;
    this.calls = 0;
  }

  step(modelOutput: Float32Array, index: number, sample: Float32Array, _noise: BatchNoise): Float32Array {
    if (this.stepRatio === 0) throw new Error(`${CLASS_NAME}: call setTimesteps before step`);
    const call = this.calls++;
    // PRK's warm-up runs on its own timesteps from the top, by call, as in diffusers.
    return call < this.prkTimesteps.length ? this.stepPrk(modelOutput, index, call, sample) : this.stepPlms(modelOutput, index, call, sample);
  }

  private stepPrk(modelOutput: Float32Array, index: number, call: number, sample: Float32Array): Float32Array {
    const stage = call % 4;
    // As diffusers' step_prk: the step starts from the warm-up's timestep of this call (by the counter)
    // and goes towards the timestep of the call's index. The two are the same from the first timestep;
    // image-to-image starting further down thus transfers from the top of the schedule, as diffusers
    // does (it denoises poorly there, in diffusers as here; `pndm` skips the warm-up).
    const t = this.prkTimesteps[call - stage];
    // Every stage moves from the step's start sample: stages 0 and 1 to the midpoint, 2 and 3 to the
    // end. As in diffusers, an even stage's target is its call timestep minus r // 2, which for an
    // odd r puts stage 0's midpoint one step away from the one the next call uses.
    const target = this.schedule[index] - (call % 2 === 0 ? Math.floor(this.stepRatio / 2) : 0);
    let eps = modelOutput;
    if (stage === 0) {
      this.ets.push(modelOutput);
      this.startSample = sample;
      this.rkSum = weightedSum([[1 / 6, modelOutput]]);
    } else if (stage < 3) {
      this.rkSum = weightedSum([[1, this.rkSum!], [1 / 3, modelOutput]]);
    } else {
      eps = weightedSum([[1, this.rkSum!], [1 / 6, modelOutput]]);
      this.rkSum = null;
    }
    return this.transfer(this.startSample!, t, target, eps);
  }

  private stepPlms(modelOutput: Float32Array, index: number, call: number, sample: Float32Array): Float32Array {
    let t = this.schedule[index];
    let target = t - this.stepRatio;
    let from = sample;
    let eps: Float32Array;
    if (this.config.skip_prk_steps && call === 1) {
      // The repeated call: redo the first step from its start with the mean of both outputs.
      eps = weightedSum([[0.5, modelOutput], [0.5, this.ets[0]]]);
      from = this.startSample!;
      target = t;
      t += this.stepRatio;
      this.startSample = null;
    } else {
      this.ets = [...this.ets.slice(-3), modelOutput];
      if (call === 0) this.startSample = sample;
      const weights = PLMS_WEIGHTS[this.ets.length - 1];
      eps = weightedSum(weights.map((w, k) => [w, this.ets[this.ets.length - 1 - k]] as const));
    }
    return this.transfer(from, t, target, eps);
  }

  /** PNDM's transfer x_t -> x_prev (eq. 9 of the paper), with eps from the model output. */
  private transfer(sample: Float32Array, t: number, prevT: number, modelOutput: Float32Array): Float32Array {
    const a = this.alphasCumprod[t];
    const aPrev = prevT >= 0 ? this.alphasCumprod[prevT] : this.finalAlphaCumprod;
    const [cSample, cOutput] = epsilonCoefficients(this.predictionType, vpFromAlphaCumprod(a));
    const denominator = a * Math.sqrt(1 - aPrev) + Math.sqrt(a * (1 - a) * aPrev);
    const k = -(aPrev - a) / denominator;
    // x_prev = sqrt(aPrev/a) x - (aPrev - a) eps / denominator, eps = cSample x + cOutput out.
    return weightedSum([
      [Math.sqrt(aPrev / a) + k * cSample, sample],
      [k * cOutput, modelOutput],
    ]);
  }
}

export const pndm: SchedulerEntry = {
  className: CLASS_NAME,
  kind: 'vp',
  names: { pndm: { skip_prk_steps: true } },
  create: (config) => new PNDMScheduler(config),
};
