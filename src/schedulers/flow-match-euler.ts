import type { BatchNoise } from '../runtime/random.js';
import type { SchedulerEntry } from './index.js';
import { linspace, rejectUnsupported, weightedSum, withDefaults } from './noise-schedule.js';
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
    rejectUnsupported(CLASS_NAME, this.config, {
      time_shift_type: 'exponential',
      invert_sigmas: false,
      shift_terminal: null,
      stochastic_sampling: false,
    });
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
      const e = Math.exp(options.mu);
      sigmas = sigmas.map((s) => e / (e + (1 / s - 1)));
    } else {
      // A shift s > 1 spends more steps at high noise, which large images need.
      sigmas = sigmas.map((s) => (c.shift * s) / (1 + (c.shift - 1) * s));
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

  step(modelOutput: Float32Array, index: number, sample: Float32Array, _noise: BatchNoise): Float32Array {
    if (this.schedule.length === 0) throw new Error(`${CLASS_NAME}: call setTimesteps before step`);
    return weightedSum([
      [1, sample],
      [this.sigmaSchedule[index + 1] - this.sigmaSchedule[index], modelOutput],
    ]);
  }
}

export const flowMatchEuler: SchedulerEntry = {
  className: CLASS_NAME,
  kind: 'flow',
  names: { flow_match_euler: {} },
  create: (config) => new FlowMatchEulerDiscreteScheduler(config),
};
