import type { BatchNoise } from '../runtime/random.js';
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

  /**
   * x_T's std. diffusers uses sqrt(sigma_max^2 + 1) with `leading` spacing and sigma_max otherwise;
   * kept so images match its pipelines.
   */
  get initNoiseSigma(): number {
    if (this.sigmaSchedule.length === 0) throw new Error('call setTimesteps first');
    const max = Math.max(...this.sigmaSchedule);
    return this.timestepSpacing === 'linspace' || this.timestepSpacing === 'trailing' ? max : Math.sqrt(max * max + 1);
  }

  /** The VP sample x / sqrt(sigma^2 + 1) the model was trained on. */
  scaleModelInput(sample: Float32Array, index: number): Float32Array {
    const sigma = this.sigmaSchedule[index];
    const scale = 1 / Math.sqrt(sigma * sigma + 1);
    return sample.map((x) => x * scale);
  }

  /** x0 + sigma * noise: the variance-exploding sample at call `index`'s noise level. */
  addNoise(original: Float32Array, noise: Float32Array, index: number): Float32Array {
    const sigma = this.sigmaSchedule[index];
    return original.map((x, i) => x + sigma * noise[i]);
  }

  abstract setTimesteps(numInferenceSteps: number): void;

  abstract step(modelOutput: Float32Array, index: number, sample: Float32Array, noise: BatchNoise): Float32Array;
}
