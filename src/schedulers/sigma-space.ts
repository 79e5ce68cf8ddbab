import type { BatchNoise } from '../engine/random.js';
import { scaleBySigma, sigmaSpaceInitNoiseSigma } from './noise-schedule.js';
import type { Scheduler } from './scheduler.js';

/**
 * What the Euler-type schedulers share: a noise level (sigma) per model call, the model input scaled
 * back to the VP sample its training used, and start noise scaled to the first sigma. Subclasses fill
 * `schedule` and `sigmaSchedule` in setTimesteps and bring the update rule.
 */
export abstract class SigmaSpaceScheduler implements Scheduler {
  /** The timesteps handed to the model. */
  protected schedule: number[] = [];
  /** The noise level at each call, then the final one (diffusers' `sigmas`). */
  protected sigmaSchedule: number[] = [];

  constructor(private readonly timestepSpacing: string) {}

  get timesteps(): readonly number[] {
    return this.schedule;
  }

  get sigmas(): readonly number[] {
    return this.sigmaSchedule;
  }

  get initNoiseSigma(): number {
    return sigmaSpaceInitNoiseSigma(this.sigmaSchedule, this.timestepSpacing);
  }

  scaleModelInput(sample: Float32Array, index: number): Float32Array {
    return scaleBySigma(sample, this.sigmaSchedule[index]);
  }

  abstract setTimesteps(numInferenceSteps: number): void;

  abstract step(modelOutput: Float32Array, index: number, sample: Float32Array, noise: BatchNoise): Float32Array;
}
