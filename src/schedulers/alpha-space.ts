import type { BatchNoise } from '../runtime/random.js';
import { noised, vpFromAlphaCumprod, type PredictionType } from './noise-schedule.js';
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

  /**
   * Refuses a schedule that visits a timestep of alpha-bar 0 (the last one under rescale_betas_zero_snr)
   * with epsilon prediction: x0 = (x - sqrt(1 - abar) eps) / sqrt(abar) divides by 0 there, and diffusers
   * draws an infinite or NaN picture. A v or sample prediction gives x0 there as anywhere else.
   */
  protected checkPredictable(className: string, predictionType: PredictionType): void {
    const t = this.schedule.find((step) => this.alphasCumprod[step] === 0);
    if (predictionType !== 'epsilon' || t === undefined) return;
    throw new Error(
      `${className}: prediction_type "epsilon" cannot denoise timestep ${t}, which is pure noise (alpha-bar 0, as rescale_betas_zero_snr makes the last one): ` +
        'zero-terminal-SNR models predict v (prediction_type "v_prediction" in scheduler_config.json); an epsilon model runs with the euler scheduler, which keeps that noise level finite',
    );
  }

  abstract setTimesteps(numInferenceSteps: number, options?: SetTimestepsOptions): void;

  abstract step(modelOutput: Float32Array, index: number, sample: Float32Array, noise: BatchNoise): Float32Array;
}
