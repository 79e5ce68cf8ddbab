import type { Scheduler } from '../schedulers/scheduler.js';

/**
 * What the model's output says the clean latents are (diffusers' `pred_original_sample`), for previews
 * of the picture while it is denoised. Any scheduler works: at call `index` the sample is
 * a * x0 + b * noise, and a and b are read off the scheduler's own addNoise (it is linear), so no
 * scheduler needs to expose its internals for this.
 */

/** What the denoiser predicts: noise (epsilon), velocity (v), the clean sample, or a rectified-flow velocity (FLUX). */
export type Prediction = 'epsilon' | 'v_prediction' | 'sample' | 'flow';

/** The prediction type of a scheduler config's `prediction_type` (diffusers' default is epsilon). */
export function predictionOf(predictionType: unknown): Prediction {
  return predictionType === 'v_prediction' || predictionType === 'sample' ? predictionType : 'epsilon';
}

/** The sample's signal and noise scales at call `index`: sample = a * x0 + b * noise. */
function noiseScales(scheduler: Scheduler, index: number): { a: number; b: number } {
  const [one, zero] = [Float32Array.of(1), Float32Array.of(0)];
  return { a: scheduler.addNoise(one, zero, index)[0], b: scheduler.addNoise(zero, one, index)[0] };
}

export function cleanEstimate(prediction: Prediction, scheduler: Scheduler, index: number, sample: Float32Array, output: Float32Array): Float32Array {
  if (prediction === 'sample') return output.slice();
  const { a, b } = noiseScales(scheduler, index);
  const x0 = new Float32Array(sample.length);
  if (prediction === 'epsilon') {
    for (let i = 0; i < x0.length; i++) x0[i] = (sample[i] - b * output[i]) / a;
  } else if (prediction === 'flow') {
    // sample = (1 - s) x0 + s z and v = z - x0, so x0 = sample - s v (b is s).
    for (let i = 0; i < x0.length; i++) x0[i] = sample[i] - b * output[i];
  } else {
    // v = alpha eps - sigma x0 in the variance-preserving form of the sample (divided by its norm r).
    const r = Math.hypot(a, b);
    const [alpha, sigma] = [a / r, b / r];
    for (let i = 0; i < x0.length; i++) x0[i] = (alpha * sample[i]) / r - sigma * output[i];
  }
  return x0;
}
