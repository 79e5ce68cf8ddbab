import type { BatchNoise } from '../runtime/random.js';
import type { SchedulerEntry } from './index.js';
import { linspace, noiseLike, rejectUnsupported, weightedSum, withDefaults } from './noise-schedule.js';
import type { Scheduler, SchedulerConfig, SetTimestepsOptions } from './scheduler.js';
import { sigmaSpacingOf, spacedSigmas, type SigmaSpacing } from './sigma-spacing.js';

const CLASS_NAME = 'FlowMatchEulerDiscreteScheduler';

const DEFAULTS = {
  num_train_timesteps: 1000,
  shift: 1,
  use_dynamic_shifting: false,
  base_shift: 0.5,
  max_shift: 1.15,
  base_image_seq_len: 256,
  max_image_seq_len: 4096,
  time_shift_type: 'exponential',
  shift_terminal: null as number | null,
  stochastic_sampling: false,
};

/** How use_dynamic_shifting bends sigma by the pipeline's mu (diffusers' _time_shift_exponential and _time_shift_linear). */
const TIME_SHIFTS: Record<string, (mu: number, sigma: number) => number> = {
  exponential: (mu, sigma) => Math.exp(mu) / (Math.exp(mu) + (1 / sigma - 1)),
  linear: (mu, sigma) => mu / (mu + (1 / sigma - 1)),
};

/**
 * FlowMatchEulerDiscreteScheduler (rectified flow, FLUX / SD3): x_sigma = (1 - sigma) x0 + sigma z,
 * the model predicts the velocity dx/dsigma, and Euler integrates it from sigma = 1 to 0.
 */
export class FlowMatchEulerDiscreteScheduler implements Scheduler {
  readonly initNoiseSigma = 1;
  private readonly config: typeof DEFAULTS & SchedulerConfig;
  /** Karras, exponential or beta noise levels in place of the shifted grid's. */
  private readonly sigmaSpacing: SigmaSpacing | undefined;
  private sigmaSchedule: number[] = [];
  private schedule: number[] = [];

  constructor(config: SchedulerConfig = {}) {
    this.config = withDefaults(DEFAULTS, config);
    // Inverted sigmas run from clean to noise, which the FLUX pipeline's start from noise does not.
    rejectUnsupported(CLASS_NAME, this.config, { invert_sigmas: false });
    if (!Object.hasOwn(TIME_SHIFTS, this.config.time_shift_type)) {
      throw new Error(`${CLASS_NAME}: time_shift_type "${String(this.config.time_shift_type)}" is not supported (${Object.keys(TIME_SHIFTS).join(', ')})`);
    }
    this.sigmaSpacing = sigmaSpacingOf(CLASS_NAME, this.config);
  }

  get timesteps(): readonly number[] {
    return this.schedule;
  }

  /** The noise level at each call, then the final one (diffusers' `sigmas`). */
  get sigmas(): readonly number[] {
    return this.sigmaSchedule;
  }

  /** `mu` (the pipeline's resolution-dependent shift) is required with use_dynamic_shifting. */
  setTimesteps(numInferenceSteps: number, options: SetTimestepsOptions = {}): void {
    const c = this.config;
    // The FLUX pipeline's grid, handed to diffusers' set_timesteps as `sigmas`. diffusers'
    // float32 tables are reproduced by rounding each stage the way it does.
    let sigmas = linspace(1, 1 / numInferenceSteps, numInferenceSteps).map(Math.fround);
    if (c.use_dynamic_shifting) {
      if (options.mu === undefined) throw new Error(`${CLASS_NAME}: use_dynamic_shifting needs setTimesteps(n, { mu })`);
      const [mu, timeShift] = [options.mu, TIME_SHIFTS[c.time_shift_type]];
      sigmas = sigmas.map((s) => timeShift(mu, s));
    } else {
      // A shift s > 1 spends more steps at high noise, which large images need.
      sigmas = sigmas.map((s) => (c.shift * s) / (1 + (c.shift - 1) * s));
    }
    if (c.shift_terminal) {
      // Stretched so that the last sigma lands on shift_terminal, the first staying at 1.
      const scale = (1 - sigmas[sigmas.length - 1]) / (1 - c.shift_terminal);
      sigmas = sigmas.map((s) => 1 - (1 - s) / scale);
    }
    sigmas = sigmas.map(Math.fround);
    if (this.sigmaSpacing) {
      // Spanning the shifted grid, from its first sigma (1) to its last.
      sigmas = spacedSigmas(this.sigmaSpacing, c, sigmas[0], sigmas[sigmas.length - 1], numInferenceSteps).map(Math.fround);
    }
    this.schedule = sigmas.map((s) => Math.fround(s * c.num_train_timesteps));
    this.sigmaSchedule = [...sigmas, 0];
  }

  scaleModelInput(sample: Float32Array): Float32Array {
    return sample;
  }

  /** The straight path between data and noise: (1 - sigma) x0 + sigma noise (diffusers' scale_noise). */
  addNoise(original: Float32Array, noise: Float32Array, index: number): Float32Array {
    const sigma = this.sigmaSchedule[index];
    return original.map((x, i) => (1 - sigma) * x + sigma * noise[i]);
  }

  step(modelOutput: Float32Array, index: number, sample: Float32Array, noise: BatchNoise): Float32Array {
    if (this.schedule.length === 0) throw new Error(`${CLASS_NAME}: call setTimesteps before step`);
    const [sigma, next] = [this.sigmaSchedule[index], this.sigmaSchedule[index + 1]];
    if (!this.config.stochastic_sampling) {
      return weightedSum([
        [1, sample],
        [next - sigma, modelOutput],
      ]);
    }
    // The clean estimate x - sigma v taken to the next sigma with fresh noise; the last step (to 0) is x0 itself.
    const terms: [number, Float32Array][] = [
      [1 - next, sample],
      [-(1 - next) * sigma, modelOutput],
    ];
    if (next > 0) terms.push([next, noiseLike(noise, sample)]);
    return weightedSum(terms);
  }
}

export const flowMatchEuler: SchedulerEntry = {
  className: CLASS_NAME,
  kind: 'flow',
  names: { flow_match_euler: {} },
  create: (config) => new FlowMatchEulerDiscreteScheduler(config),
};
