import type { BatchNoise } from '../engine/random.js';
import type { Scheduler } from '../schedulers/scheduler.js';
import { GenerationCancelled, type GenerateHooks } from './pipeline.js';

/**
 * The denoising loop every family shares: the scheduler decides the timesteps and the update, the
 * family's `predict` wraps the model call (guidance, extra inputs, packing).
 */
export async function denoise(
  scheduler: Scheduler,
  latents: Float32Array,
  noise: BatchNoise,
  predict: (modelInput: Float32Array, timestep: number) => Promise<Float32Array>,
  hooks: GenerateHooks = {},
): Promise<Float32Array> {
  let x = latents;
  const total = scheduler.timesteps.length;
  for (let i = 0; i < total; i++) {
    if (hooks.shouldStop?.()) throw new GenerationCancelled();
    const output = await predict(scheduler.scaleModelInput(x, i), scheduler.timesteps[i]);
    x = scheduler.step(output, i, x, noise);
    hooks.onStep?.(i + 1, total);
  }
  return x;
}

/** Initial latents: each item's own Gaussian noise, times the scheduler's starting sigma. */
export function initialLatents(noise: BatchNoise, perItem: number, initNoiseSigma: number): Float32Array {
  const x = noise.randn(perItem);
  for (let i = 0; i < x.length; i++) x[i] *= initNoiseSigma;
  return x;
}
