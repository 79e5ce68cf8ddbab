import type { BatchNoise } from '../runtime/random.js';
import { noised, vpFromAlphaCumprod } from './noise-schedule.js';
import type { Scheduler, SetTimestepsOptions } from './scheduler.js';

/**
 * What the schedulers that step over the training alphas share (DDIM, PNDM, LCM): start noise of unit
 * std, the sample handed to the model as it is, and image-to-image's start noised to the training
 * alpha-bar of call `index`'s timestep. Subclasses fill `schedule` in setTimesteps and bring the
 * update rule; the Euler-type schedulers share SigmaSpaceScheduler instead.
 */
export abstract class AlphaSpaceScheduler implements Scheduler {
  readonly initNoiseSigma = 1;
  /** The timesteps handed to the model, one per call. */
  protected schedule: number[] = [];
  /** alpha-bar at each training timestep. */
  protected abstract readonly alphasCumprod: Float32Array;

  get timesteps(): readonly number[] {
    return this.schedule;
  }

  scaleModelInput(sample: Float32Array): Float32Array {
    return sample;
  }

  addNoise(original: Float32Array, noise: Float32Array, index: number): Float32Array {
    return noised(original, noise, vpFromAlphaCumprod(this.alphasCumprod[this.schedule[index]]));
  }

  abstract setTimesteps(numInferenceSteps: number, options?: SetTimestepsOptions): void;

  abstract step(modelOutput: Float32Array, index: number, sample: Float32Array, noise: BatchNoise): Float32Array;
}
