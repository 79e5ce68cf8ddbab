import type { BatchNoise } from '../runtime/random.js';
import type { SchedulerEntry } from './index.js';
import {
  checkPredictionType,
  DDPM_TRAINING_DEFAULTS,
  eulerUpdate,
  interpolateTable,
  noiseLike,
  spacedTimesteps,
  trainingSigmas,
  withDefaults,
  type PredictionType,
} from './noise-schedule.js';
import type { SchedulerConfig } from './scheduler.js';
import { SigmaSpaceScheduler } from './sigma-space.js';

const CLASS_NAME = 'EulerAncestralDiscreteScheduler';

const DEFAULTS = {
  ...DDPM_TRAINING_DEFAULTS,
  prediction_type: 'epsilon',
  timestep_spacing: 'linspace',
  steps_offset: 0,
};

/**
 * EulerAncestralDiscreteScheduler: each step goes deterministically down to sigma_down, then adds
 * fresh noise of std sigma_up so the sample lands at the next sigma (sigma_down^2 + sigma_up^2 =
 * sigma_next^2). The fresh noise makes results depend on the generator, not just the start noise.
 */
export class EulerAncestralDiscreteScheduler extends SigmaSpaceScheduler {
  private readonly config: typeof DEFAULTS & SchedulerConfig;
  private readonly predictionType: PredictionType;
  private readonly trainSigmas: Float32Array;

  constructor(config: SchedulerConfig = {}) {
    const resolved = withDefaults(DEFAULTS, config);
    super(resolved.timestep_spacing);
    this.config = resolved;
    // diffusers has no `sample` prediction for this scheduler.
    this.predictionType = checkPredictionType(CLASS_NAME, this.config.prediction_type, ['epsilon', 'v_prediction']);
    this.trainSigmas = trainingSigmas(this.config);
  }

  setTimesteps(numInferenceSteps: number): void {
    const c = this.config;
    this.schedule = spacedTimesteps(c.timestep_spacing, c.num_train_timesteps, numInferenceSteps, c.steps_offset).map(Math.fround);
    this.sigmaSchedule = [...this.schedule.map((t) => interpolateTable(this.trainSigmas, t)), 0];
  }

  step(modelOutput: Float32Array, index: number, sample: Float32Array, noise: BatchNoise): Float32Array {
    const sigma = this.sigmaSchedule[index];
    const sigmaNext = this.sigmaSchedule[index + 1];
    const sigmaUp = Math.sqrt((sigmaNext * sigmaNext * (sigma * sigma - sigmaNext * sigmaNext)) / (sigma * sigma));
    const sigmaDown = Math.sqrt(sigmaNext * sigmaNext - sigmaUp * sigmaUp);
    const next = eulerUpdate(this.predictionType, modelOutput, sample, sigma, sigmaDown);
    // The last step has sigma_up = 0; skipping its draw changes nothing but the time spent.
    if (sigmaUp > 0) {
      const z = noiseLike(noise, next);
      for (let i = 0; i < next.length; i++) next[i] += z[i] * sigmaUp;
    }
    return next;
  }
}

export const eulerAncestral: SchedulerEntry = {
  className: CLASS_NAME,
  kind: 'vp',
  names: { euler_a: {} },
  create: (config) => new EulerAncestralDiscreteScheduler(config),
};
