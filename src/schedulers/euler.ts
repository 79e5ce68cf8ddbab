import type { BatchNoise } from '../runtime/random.js';
import type { SchedulerEntry } from './index.js';
import {
  checkPredictionType,
  DDPM_TRAINING_DEFAULTS,
  eulerUpdate,
  finalSigma,
  interpolateTable,
  linspace,
  spacedTimesteps,
  timestepsForSigmas,
  trainingSigmas,
  withDefaults,
  type PredictionType,
} from './noise-schedule.js';
import type { SchedulerConfig } from './scheduler.js';
import { SigmaSpaceScheduler } from './sigma-space.js';
import { sigmaSpacingOf, spacedSigmas, type SigmaSpacing } from './sigma-spacing.js';

const CLASS_NAME = 'EulerDiscreteScheduler';

const DEFAULTS = {
  ...DDPM_TRAINING_DEFAULTS,
  prediction_type: 'epsilon',
  interpolation_type: 'linear',
  use_karras_sigmas: false,
  sigma_min: null as number | null,
  sigma_max: null as number | null,
  timestep_spacing: 'linspace',
  timestep_type: 'discrete',
  steps_offset: 0,
  final_sigmas_type: 'zero',
};

/**
 * EulerDiscreteScheduler: Karras et al.'s Euler method for the probability-flow ODE, in sigma space.
 * The model sees x / sqrt(sigma^2 + 1), i.e. the VP sample its training used.
 */
export class EulerDiscreteScheduler extends SigmaSpaceScheduler {
  private readonly config: typeof DEFAULTS & SchedulerConfig;
  private readonly predictionType: PredictionType;
  /** Training sigma per integer timestep, ascending. */
  private readonly trainSigmas: Float32Array;
  /** Karras, exponential or beta noise levels in place of the table's at the spaced timesteps. */
  private readonly sigmaSpacing: SigmaSpacing | undefined;

  constructor(config: SchedulerConfig = {}) {
    const resolved = withDefaults(DEFAULTS, config);
    super(resolved.timestep_spacing);
    this.config = resolved;
    this.sigmaSpacing = sigmaSpacingOf(CLASS_NAME, this.config);
    this.predictionType = checkPredictionType(
      CLASS_NAME,
      this.config.prediction_type === 'original_sample' ? 'sample' : this.config.prediction_type,
      ['epsilon', 'v_prediction', 'sample'],
    );
    this.trainSigmas = trainingSigmas(this.config);
  }

  setTimesteps(numInferenceSteps: number): void {
    const c = this.config;
    const table = this.trainSigmas;
    // diffusers keeps these timesteps in float32 (999, 957.375, ...).
    let timesteps = spacedTimesteps(c.timestep_spacing, c.num_train_timesteps, numInferenceSteps, c.steps_offset).map(Math.fround);
    let sigmas: number[];
    switch (c.interpolation_type) {
      case 'linear':
        sigmas = timesteps.map((t) => interpolateTable(table, t));
        break;
      case 'log_linear':
        // As diffusers: N+1 log-spaced sigmas, so the last step stops at sigma_min before the final sigma.
        sigmas = linspace(Math.log(table[table.length - 1]), Math.log(table[0]), numInferenceSteps + 1).map(Math.exp);
        break;
      default:
        throw new Error(`${CLASS_NAME}: interpolation_type "${c.interpolation_type}" is not supported (linear, log_linear)`);
    }
    if (this.sigmaSpacing) {
      // Spanning the interpolated sigmas (log_linear's N+1 too), then each one's fractional timestep.
      sigmas = spacedSigmas(this.sigmaSpacing, c, sigmas[0], sigmas[sigmas.length - 1], numInferenceSteps);
      timesteps = timestepsForSigmas(sigmas, table);
    }
    sigmas.push(finalSigma(c.final_sigmas_type, table));
    if (c.timestep_type === 'continuous' && c.prediction_type === 'v_prediction') {
      // EDM-style v models take c_noise = log(sigma) / 4 instead of a training timestep.
      timesteps = sigmas.slice(0, -1).map((s) => 0.25 * Math.log(s));
    }
    this.sigmaSchedule = sigmas;
    this.schedule = timesteps;
  }

  step(modelOutput: Float32Array, index: number, sample: Float32Array, _noise: BatchNoise): Float32Array {
    return eulerUpdate(this.predictionType, modelOutput, sample, this.sigmaSchedule[index], this.sigmaSchedule[index + 1]);
  }
}

export const euler: SchedulerEntry = {
  className: CLASS_NAME,
  kind: 'vp',
  names: { euler: {} },
  create: (config) => new EulerDiscreteScheduler(config),
};
