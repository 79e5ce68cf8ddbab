/**
 * The scheduler config SD 1.x/2.x generations run from (models/layout.ts pipelineScheduler): diffusers'
 * StableDiffusionPipeline (and its image-to-image, inpainting and ONNX versions) sets steps_offset to 1
 * and clip_sample to false in an outdated scheduler_config.json as it loads it, so such a model runs
 * with those in diffusers, whatever the file says. Expected values are worked out here from diffusers'
 * formulas (DDIMScheduler.set_timesteps' leading spacing and step), not through the schedulers' code.
 */
import { describe, expect, it } from 'vitest';
import { pipelineScheduler } from '../src/models/layout.js';
import type { BatchNoise } from '../src/runtime/random.js';
import { createScheduler } from '../src/schedulers/index.js';
import type { SchedulerConfig } from '../src/schedulers/scheduler.js';

/** An SD 1.x DDIM config of the kind early fine-tunes ship: no steps_offset (DDIM's default 0), no clip_sample (DDIM's default true). */
const OUTDATED: SchedulerConfig = {
  _class_name: 'DDIMScheduler',
  beta_start: 0.00085,
  beta_end: 0.012,
  beta_schedule: 'scaled_linear',
  num_train_timesteps: 1000,
  set_alpha_to_one: false,
  trained_betas: null,
};

const sd = (scheduler: SchedulerConfig, denoiserConfig: Record<string, unknown> = {}) => ({ family: 'sd', scheduler, denoiserConfig });

function timesteps(config: SchedulerConfig, override?: string, steps = 50): readonly number[] {
  const scheduler = createScheduler(config, override);
  scheduler.setTimesteps(steps);
  return scheduler.timesteps;
}

/** Leading spacing of 50 steps over 1000: arange(50) * 20, descending, plus steps_offset. */
const leading = (offset: number) => Array.from({ length: 50 }, (_, i) => 980 - 20 * i + offset);

/** abar_t of SD's scaled-linear betas: cumprod(1 - linspace(sqrt(b0), sqrt(b1), 1000)^2). */
function alphaCumprod(t: number): number {
  const [a, b] = [Math.sqrt(0.00085), Math.sqrt(0.012)];
  let product = 1;
  for (let i = 0; i <= t; i++) product *= 1 - (a + ((b - a) * i) / 999) ** 2;
  return product;
}

describe("an SD 1.x/2.x model's scheduler config, as diffusers' Stable Diffusion pipelines rewrite it", () => {
  it('runs the model\'s own scheduler with steps_offset 1 where the file names none (981 ... 1, not 980 ... 0)', () => {
    expect(timesteps(OUTDATED)).toEqual(leading(0));
    expect(timesteps(pipelineScheduler(sd(OUTDATED)))).toEqual(leading(1));
    expect(timesteps(pipelineScheduler(sd({ ...OUTDATED, steps_offset: 0 })))).toEqual(leading(1));
  });

  it('does not clip the predicted x0 to [-1, 1], as DDIM does by default', () => {
    // One DDIM step from t = 981 to 961 with an epsilon prediction of 0: x0 = x / sqrt(abar_981), far
    // outside [-1, 1] for x = 3, then x_prev = sqrt(abar_961) * x0 (+ sqrt(1 - abar_961) * 0).
    const scheduler = createScheduler(pipelineScheduler(sd(OUTDATED)));
    scheduler.setTimesteps(50);
    expect(scheduler.timesteps.slice(0, 2)).toEqual([981, 961]);
    const next = scheduler.step(new Float32Array([0]), 0, new Float32Array([3]), {} as BatchNoise);
    const unclipped = Math.sqrt(alphaCumprod(961)) * (3 / Math.sqrt(alphaCumprod(981)));
    expect(next[0]).toBeCloseTo(unclipped, 4);
    // The file's class alone (offset 0) clips x0 to 1 in its step from 960 to 940: sqrt(abar_940).
    const clipped = createScheduler(OUTDATED);
    clipped.setTimesteps(50);
    expect(clipped.step(new Float32Array([0]), 1, new Float32Array([3]), {} as BatchNoise)[0]).toBeCloseTo(Math.sqrt(alphaCumprod(940)), 4);
  });

  it("gives a scheduler a request names steps_offset 1 only where the file names one, as from_config leaves a value only defaulted to the named class", () => {
    const spaced = { ...OUTDATED, timestep_spacing: 'leading' };
    expect(timesteps(pipelineScheduler(sd(spaced), 'euler'), 'euler')).toEqual(leading(0));
    expect(timesteps(pipelineScheduler(sd({ ...spaced, steps_offset: 0 }), 'euler'), 'euler')).toEqual(leading(1));
  });

  it('leaves SDXL models and distilled latent consistency models as their files say, as their pipelines do', () => {
    const config = { ...OUTDATED, steps_offset: 0 };
    expect(pipelineScheduler({ family: 'sdxl', scheduler: config, denoiserConfig: {} })).toBe(config);
    expect(pipelineScheduler(sd(config, { time_cond_proj_dim: 256 }))).toBe(config);
  });
});
