/**
 * The schedulers against huggingface/diffusers' own numbers: the expected values and configs come from
 * diffusers `tests/schedulers/test_scheduler_*.py` (harness in test_schedulers.py), the SD1.5 Euler
 * table from the WebNN SD1.5 demo, which prints diffusers' schedule.
 */
import { describe, expect, it } from 'vitest';
import { BatchNoise, Rng } from '../src/runtime/random.js';
import { DDIMScheduler } from '../src/schedulers/ddim.js';
import { DPMSolverMultistepScheduler } from '../src/schedulers/dpm-solver-multistep.js';
import { EulerAncestralDiscreteScheduler } from '../src/schedulers/euler-ancestral.js';
import { EulerDiscreteScheduler } from '../src/schedulers/euler.js';
import { FlowMatchEulerDiscreteScheduler } from '../src/schedulers/flow-match-euler.js';
import { createScheduler, refusalNote, SCHEDULER_NAMES, schedulersFor, schedulersRunning, standInFor } from '../src/schedulers/index.js';
import { LCMScheduler } from '../src/schedulers/lcm.js';
import { betaQuantile } from '../src/schedulers/beta-quantile.js';
import { trainingAlphasCumprod } from '../src/schedulers/noise-schedule.js';
import { PNDMScheduler } from '../src/schedulers/pndm.js';
import type { Scheduler, SchedulerConfig } from '../src/schedulers/scheduler.js';

// ---------------------------------------------------------------------------------------------
// diffusers' test harness
// ---------------------------------------------------------------------------------------------

const BATCH = 4;

/** dummy_sample_deter: arange(768) / 768 reshaped (3, 8, 8, 4), permuted to [4, 3, 8, 8]. */
function dummySampleDeter(): Float32Array {
  const [c, h, w] = [3, 8, 8];
  const out = new Float32Array(BATCH * c * h * w);
  for (let b = 0; b < BATCH; b++)
    for (let ci = 0; ci < c; ci++)
      for (let y = 0; y < h; y++)
        for (let x = 0; x < w; x++) out[((b * c + ci) * h + y) * w + x] = (((ci * h + y) * w + x) * BATCH + b) / out.length;
  return out;
}

/** dummy_model: sample * t / (t + 1), in float32 like torch. */
function dummyModel(sample: Float32Array, t: number): Float32Array {
  const tf = Math.fround(t);
  const denominator = Math.fround(tf + 1);
  return sample.map((x) => Math.fround(x * tf) / denominator);
}

/** For deterministic schedulers: any draw is a bug. */
const NO_NOISE = {
  batchSize: BATCH,
  randn: () => {
    throw new Error('a deterministic scheduler drew noise');
  },
} as unknown as BatchNoise;

/** Noise of zeros, to isolate the deterministic part of stochastic schedulers. */
function zeroNoise(batchSize: number, draws: number[] = []): BatchNoise {
  return {
    batchSize,
    randn: (perItem: number) => {
      draws.push(perItem);
      return new Float32Array(perItem * batchSize);
    },
  } as unknown as BatchNoise;
}

/**
 * diffusers' full_loop: x = sample * init_noise_sigma; per timestep x = scale_model_input(x) (the
 * Euler tests feed that scaled x on to step, so do we); model; step. Identity scaling elsewhere.
 */
function fullLoop(scheduler: Scheduler, steps = 10, noise: BatchNoise = NO_NOISE): Float32Array {
  scheduler.setTimesteps(steps);
  const init = scheduler.initNoiseSigma;
  let x: Float32Array = dummySampleDeter().map((v) => v * init);
  scheduler.timesteps.forEach((t, i) => {
    x = scheduler.scaleModelInput(x, i);
    x = scheduler.step(dummyModel(x, t), i, x, noise);
  });
  return x;
}

function absStats(x: Float32Array): { sum: number; mean: number } {
  let sum = 0;
  for (const v of x) sum += Math.abs(v);
  return { sum, mean: sum / x.length };
}

/**
 * Relative error below 1e-4, or within half a unit of the last digit diffusers printed (its means are
 * often given to 3 or 4 digits only, e.g. 0.0131 for 10.0807 / 768).
 */
function expectMatches(actual: number, expected: string): void {
  const [mantissa, exponent = '0'] = expected.toLowerCase().split('e');
  const decimals = (mantissa.split('.')[1]?.length ?? 0) - Number(exponent);
  const value = Number(expected);
  const tolerance = Math.max(1e-4 * Math.abs(value), 0.5 * 10 ** -decimals);
  expect(Math.abs(actual - value), `${actual} vs ${expected}`).toBeLessThanOrEqual(tolerance);
}

function expectLoop(x: Float32Array, sum: string | null, mean: string): void {
  const stats = absStats(x);
  if (sum !== null) expectMatches(stats.sum, sum);
  expectMatches(stats.mean, mean);
}

function expectCloseArray(actual: readonly number[], expected: readonly number[], relative = 1e-6): void {
  expect(actual.length).toBe(expected.length);
  actual.forEach((a, i) => {
    expect(Math.abs(a - expected[i]), `[${i}] ${a} vs ${expected[i]}`).toBeLessThanOrEqual(relative * Math.max(Math.abs(expected[i]), 1e-3));
  });
}

const SD15: SchedulerConfig = {
  _class_name: 'PNDMScheduler',
  beta_start: 0.00085,
  beta_end: 0.012,
  beta_schedule: 'scaled_linear',
  clip_sample: false,
  num_train_timesteps: 1000,
  set_alpha_to_one: false,
  skip_prk_steps: true,
  steps_offset: 1,
  trained_betas: null,
};

// ---------------------------------------------------------------------------------------------
// Timestep and sigma tables
// ---------------------------------------------------------------------------------------------

describe('timestep tables', () => {
  it('SD1.5 leading spacing, 50 steps: 981, 961, ..., 1', () => {
    const s = new DDIMScheduler(SD15);
    s.setTimesteps(50);
    expect(s.timesteps).toEqual(Array.from({ length: 50 }, (_, i) => 981 - 20 * i));
  });

  it('DDIM steps_offset 1, 5 steps (test_steps_offset)', () => {
    const s = new DDIMScheduler({ steps_offset: 1 });
    s.setTimesteps(5);
    expect(s.timesteps).toEqual([801, 601, 401, 201, 1]);
  });

  it('trailing spacing, 4 steps: 999, 749, 499, 249', () => {
    for (const s of [new DDIMScheduler({ ...SD15, timestep_spacing: 'trailing' }), new EulerDiscreteScheduler({ ...SD15, timestep_spacing: 'trailing' })]) {
      s.setTimesteps(4);
      expect(s.timesteps).toEqual([999, 749, 499, 249]);
    }
  });

  it('trailing spacing rounds halves to even like numpy (16 steps)', () => {
    const s = new DDIMScheduler({ timestep_spacing: 'trailing' });
    s.setTimesteps(16);
    // arange(1000, 0, -62.5) rounded: 937.5 -> 938 but 812.5 -> 812, then minus 1.
    expect(s.timesteps.slice(0, 4)).toEqual([999, 937, 874, 811]);
  });

  it("trailing spacing takes numpy arange's values, not exact multiples (SD-Turbo's Euler ancestral, 48 steps)", () => {
    // diffusers: np.arange(1000, 0, -1000 / 48).round() - 1, computed with numpy 2.4. numpy fills arange as
    // start + i * ((start - step) - start): the 4th and 28th values come out just under 937.5 and 437.5 and
    // round down (timesteps 936, 436), where 1000 - i * step gives the exact halves, rounded to even (937, 437).
    const expected = [
      999, 978, 957, 936, 916, 895, 874, 853, 832, 811, 791, 770, 749, 728, 707, 686, 666, 645, 624, 603, 582, 561, 541, 520, 499,
      478, 457, 436, 416, 395, 374, 353, 332, 311, 291, 270, 249, 228, 207, 186, 166, 145, 124, 103, 82, 61, 41, 20,
    ];
    const turbo = { ...SD15, timestep_spacing: 'trailing', steps_offset: 1 };
    for (const s of [new EulerAncestralDiscreteScheduler(turbo), new DDIMScheduler(turbo)]) {
      s.setTimesteps(48);
      expect(s.timesteps).toEqual(expected);
    }
  });

  it('LCM, 4 steps: 999, 759, 499, 259', () => {
    const s = new LCMScheduler({});
    s.setTimesteps(4);
    expect(s.timesteps).toEqual([999, 759, 499, 259]);
  });

  it('PNDM skip_prk_steps repeats the second timestep (SD1.5, 50 steps = 51 calls)', () => {
    const s = new PNDMScheduler(SD15);
    s.setTimesteps(50);
    expect(s.timesteps).toHaveLength(51);
    expect(s.timesteps.slice(0, 4)).toEqual([981, 961, 961, 941]);
    expect(s.timesteps.at(-1)).toBe(1);
  });

  it('PNDM with PRK warm-up, steps_offset 1, 10 steps (test_steps_offset)', () => {
    const s = new PNDMScheduler({ steps_offset: 1 });
    s.setTimesteps(10);
    expect(s.timesteps).toEqual([901, 851, 851, 801, 801, 751, 751, 701, 701, 651, 651, 601, 601, 501, 401, 301, 201, 101, 1]);
  });

  it('Euler, SD1.5 25 steps: the WebNN demo sigma and timestep table', () => {
    const s = new EulerDiscreteScheduler({ ...SD15, _class_name: 'EulerDiscreteScheduler' });
    s.setTimesteps(25);
    expectCloseArray(
      s.sigmas,
      [
        14.614647, 11.435942, 9.076809, 7.3019943, 5.9489183, 4.903778, 4.0860896, 3.4381795, 2.9183085, 2.495972, 2.1485956, 1.8593576,
        1.6155834, 1.407623, 1.2280698, 1.0711612, 0.9323583, 0.80802417, 0.695151, 0.5911423, 0.49355352, 0.3997028, 0.30577788, 0.20348993,
        0.02916753, 0,
      ],
      1e-6,
    );
    expect(s.timesteps).toEqual([
      999, 957.375, 915.75, 874.125, 832.5, 790.875, 749.25, 707.625, 666, 624.375, 582.75, 541.125, 499.5, 457.875, 416.25, 374.625, 333, 291.375,
      249.75, 208.125, 166.5, 124.875, 83.25, 41.625, 0,
    ]);
    // linspace spacing starts from sigma_max itself.
    expect(s.initNoiseSigma).toBeCloseTo(14.614647, 5);
  });

  it('Euler with leading spacing starts from sqrt(sigma_max^2 + 1)', () => {
    const s = new EulerDiscreteScheduler({ ...SD15, timestep_spacing: 'leading' });
    s.setTimesteps(50);
    expect(s.timesteps[0]).toBe(981);
    expect(s.initNoiseSigma).toBeCloseTo(Math.sqrt(s.sigmas[0] ** 2 + 1), 10);
  });

  it('Euler Karras sigmas run from sigma_max to sigma_min with log-sigma timesteps', () => {
    const s = new EulerDiscreteScheduler({ ...SD15, use_karras_sigmas: true });
    s.setTimesteps(10);
    expect(s.sigmas).toHaveLength(11);
    expect(s.sigmas[0]).toBeCloseTo(14.614647, 4);
    expect(s.sigmas[9]).toBeCloseTo(0.02916753, 6);
    expect(s.sigmas[10]).toBe(0);
    expect(s.timesteps[0]).toBeCloseTo(999, 6);
    expect(s.timesteps[9]).toBeCloseTo(0, 6);
  });

  it('final_sigmas_type sigma_min ends on the smallest training sigma', () => {
    const s = new EulerDiscreteScheduler({ ...SD15, final_sigmas_type: 'sigma_min' });
    s.setTimesteps(4);
    expect(s.sigmas.at(-1)).toBeCloseTo(0.02916753, 6);
  });
});

describe('FlowMatchEulerDiscreteScheduler tables', () => {
  it('FLUX schnell, 4 steps: sigmas 1, .75, .5, .25, 0 and timesteps sigma * 1000', () => {
    const s = new FlowMatchEulerDiscreteScheduler({ shift: 1, use_dynamic_shifting: false });
    s.setTimesteps(4);
    expect(s.sigmas).toEqual([1, 0.75, 0.5, 0.25, 0]);
    expect(s.timesteps).toEqual([1000, 750, 500, 250]);
    expect(s.initNoiseSigma).toBe(1);
  });

  // Expected values: diffusers' FluxPipeline grid through FlowMatchEulerDiscreteScheduler.set_timesteps
  // (exponential time shift in float32), evaluated with numpy.
  const FLUX_DEV: SchedulerConfig = { shift: 3, use_dynamic_shifting: true, base_shift: 0.5, max_shift: 1.15, base_image_seq_len: 256, max_image_seq_len: 4096 };

  it('FLUX dev dynamic shift, mu = 1.15 (1024x1024), 4 steps', () => {
    const s = new FlowMatchEulerDiscreteScheduler(FLUX_DEV);
    s.setTimesteps(4, { mu: 1.15 });
    expectCloseArray(s.sigmas, [1, 0.9045307636260986, 0.7595109343528748, 0.5128441452980042, 0]);
    expectCloseArray(s.timesteps, [1000, 904.53076171875, 759.5109252929688, 512.8441162109375]);
  });

  it('FLUX dev dynamic shift, 28 steps', () => {
    const s = new FlowMatchEulerDiscreteScheduler(FLUX_DEV);
    s.setTimesteps(28, { mu: 1.15 });
    expectCloseArray(s.sigmas.slice(0, 5), [1, 0.988408625125885, 0.9762224555015564, 0.9633944034576416, 0.9498725533485413]);
    expect(s.sigmas[27]).toBeCloseTo(0.10472089797258377, 6);
    s.setTimesteps(28, { mu: 0.5 });
    expectCloseArray(s.timesteps.slice(0, 5), [1000, 978.0294799804688, 955.4235229492188, 932.1543579101562, 908.1922607421875]);
    expect(s.sigmas[27]).toBeCloseTo(0.05754955857992172, 6);
  });

  it('dynamic shifting without mu is an error; a static shift bends the grid', () => {
    expect(() => new FlowMatchEulerDiscreteScheduler(FLUX_DEV).setTimesteps(4)).toThrow(/mu/);
    const s = new FlowMatchEulerDiscreteScheduler({ shift: 3 });
    s.setTimesteps(2);
    // 3 * 0.5 / (1 + 2 * 0.5)
    expect(s.sigmas).toEqual([1, 0.75, 0]);
  });

  // Expected values: diffusers' set_timesteps on the same grid and mu, evaluated with numpy in float32 (as above).
  it("time_shift_type linear bends the grid by mu itself, and only under dynamic shifting, as diffusers' time_shift does", () => {
    const s = new FlowMatchEulerDiscreteScheduler({ ...FLUX_DEV, time_shift_type: 'linear' });
    s.setTimesteps(4, { mu: 1.15 });
    // mu / (mu + (1 / sigma - 1))
    expectCloseArray(s.sigmas, [1, 0.7752808928489685, 0.5348836779594421, 0.27710843086242676, 0]);
    expectCloseArray(s.timesteps, [1000, 775.2808837890625, 534.8836669921875, 277.1084289550781]);
    const fixed = new FlowMatchEulerDiscreteScheduler({ shift: 3, time_shift_type: 'linear' });
    fixed.setTimesteps(2);
    expect(fixed.sigmas).toEqual([1, 0.75, 0]);
    expect(() => new FlowMatchEulerDiscreteScheduler({ time_shift_type: 'cubic' })).toThrow('FlowMatchEulerDiscreteScheduler: time_shift_type "cubic" is not supported (exponential, linear)');
  });

  it('shift_terminal stretches the shifted grid so that its last sigma lands on it, the first staying at 1', () => {
    const dynamic = new FlowMatchEulerDiscreteScheduler({ ...FLUX_DEV, shift_terminal: 0.02 });
    dynamic.setTimesteps(4, { mu: 1.15 });
    expectCloseArray(dynamic.sigmas, [1, 0.8079468011856079, 0.5162137746810913, 0.019999980926513672, 0]);
    expectCloseArray(dynamic.timesteps, [1000, 807.94677734375, 516.2137451171875, 19.999980926513672]);
    const linear = new FlowMatchEulerDiscreteScheduler({ ...FLUX_DEV, time_shift_type: 'linear', shift_terminal: 0.1 });
    linear.setTimesteps(4, { mu: 1.15 });
    expectCloseArray(linear.sigmas, [1, 0.7202247381210327, 0.4209302067756653, 0.10000002384185791, 0]);
    const fixed = new FlowMatchEulerDiscreteScheduler({ shift: 3, shift_terminal: 0.1 });
    fixed.setTimesteps(4);
    expectCloseArray(fixed.sigmas, [1, 0.8199999332427979, 0.550000011920929, 0.10000002384185791, 0]);
  });

  it('stochastic_sampling takes the clean estimate x - sigma v to the next sigma with fresh noise, the last step to x0 without', () => {
    const s = new FlowMatchEulerDiscreteScheduler({ stochastic_sampling: true });
    s.setTimesteps(4);
    const x = Float32Array.from([1, 2]);
    const v = Float32Array.from([4, -8]);
    const draws: number[] = [];
    // x0 = x - 1 * v = [-3, 10]; (1 - 0.75) * x0 + 0.75 * noise, noise of zeros.
    expect(Array.from(s.step(v, 0, x, zeroNoise(1, draws)))).toEqual([-0.75, 2.5]);
    expect(draws).toEqual([2]);
    // At sigma 0.25 to 0: x0 = x - 0.25 v, with no draw.
    expect(Array.from(s.step(v, 3, x, NO_NOISE))).toEqual([0, 4]);
    expect(() => new FlowMatchEulerDiscreteScheduler({ invert_sigmas: true })).toThrow('FlowMatchEulerDiscreteScheduler: invert_sigmas=true is not supported');
  });

  it('step is x + (sigma_next - sigma) * v', () => {
    const s = new FlowMatchEulerDiscreteScheduler({});
    s.setTimesteps(4);
    const x = Float32Array.from([1, 2]);
    const v = Float32Array.from([4, -8]);
    expect(Array.from(s.step(v, 0, x, NO_NOISE))).toEqual([0, 4]);
    expect(s.scaleModelInput(x)).toBe(x);
  });
});

// ---------------------------------------------------------------------------------------------
// Exponential and beta sigmas (use_exponential_sigmas, use_beta_sigmas)
// ---------------------------------------------------------------------------------------------

/**
 * Computed with numpy 2.4 and scipy 1.17 following diffusers 0.40.0.dev0 (commit 58eb52c): each class's
 * set_timesteps with its _convert_to_exponential / _convert_to_beta (scipy.stats.beta.ppf(p, 0.6, 0.6)),
 * on torch's float32 training table (log_sigmas in float32, as np.log of it is), and for FLUX the
 * pipeline's sigma grid with its shift; sigmas as diffusers stores them, in float32.
 */
describe('exponential and beta sigmas, as diffusers spaces them', () => {
  /** The reference SD 1.5 export's Euler config (leading spacing, steps_offset 1). */
  const EULER_SD15: SchedulerConfig = { ...SD15, _class_name: 'EulerDiscreteScheduler', interpolation_type: 'linear', prediction_type: 'epsilon', timestep_spacing: 'leading', use_karras_sigmas: false };
  /** SD 1.5's betas in a DPM-Solver config as diffusers saves one switched from PNDM. */
  const DPM_SD15: SchedulerConfig = { ...SD15, _class_name: 'DPMSolverMultistepScheduler' };
  const SCHNELL: SchedulerConfig = { _class_name: 'FlowMatchEulerDiscreteScheduler', shift: 1, use_dynamic_shifting: false };
  const DEV: SchedulerConfig = { _class_name: 'FlowMatchEulerDiscreteScheduler', shift: 3, use_dynamic_shifting: true };

  function schedule(config: SchedulerConfig, steps: number, mu?: number): { sigmas: number[]; timesteps: number[] } {
    const s = createScheduler(config) as EulerDiscreteScheduler | DPMSolverMultistepScheduler | FlowMatchEulerDiscreteScheduler;
    s.setTimesteps(steps, { mu });
    return { sigmas: [...s.sigmas], timesteps: [...s.timesteps] };
  }

  /** Each case's schedule against diffusers': [config, steps, mu (FLUX dev), sigmas, timesteps]. */
  function expectSchedules(cases: ReadonlyArray<[SchedulerConfig, number, number | undefined, number[], number[]]>): void {
    for (const [config, steps, mu, sigmas, timesteps] of cases) {
      const s = schedule(config, steps, mu);
      expectCloseArray(s.sigmas, sigmas);
      expectCloseArray(s.timesteps, timesteps);
    }
  }

  it("Euler spans the spaced timesteps' sigmas (751 down to 1 on leading spacing), each given its fractional timestep", () => {
    const [exponential, beta] = [{ ...EULER_SD15, use_exponential_sigmas: true }, { ...EULER_SD15, use_beta_sigmas: true }];
    expectSchedules([
      [exponential, 4, undefined, [4.11669827, 0.887973726, 0.191536352, 0.041314479, 0], [751, 318.633606, 37.2917442, 1.00000012]],
      [exponential, 10, undefined, [8.39068699, 4.64929342, 2.57618093, 1.42746603, 0.790961206, 0.438272893, 0.242847711, 0.134562314, 0.0745611936, 0.041314479, 0], [901, 778.956726, 632.948425, 462.129852, 285.321716, 142.093933, 56.8310814, 19.0319004, 5.44139957, 1.00000012]],
      [beta, 4, undefined, [4.11669827, 2.99428344, 1.16372931, 0.041314479, 0], [751, 672.662842, 399.826538, 1.00000012]],
      [beta, 10, undefined, [8.39068699, 7.99749994, 7.17500925, 6.09115887, 4.85744333, 3.57455826, 2.34084272, 1.25699222, 0.434501618, 0.041314479, 0], [901, 891.836243, 870.657532, 837.427856, 788.766174, 717.199585, 606.753235, 423.359894, 140.415131, 1.00000012]],
      // The config's sigma_min and sigma_max are the ends where it sets them.
      [{ ...exponential, sigma_min: 0.1, sigma_max: 10 }, 3, undefined, [10, 1, 0.1, 0], [933.506653, 353.890289, 10.3821688]],
      [{ ...beta, sigma_min: 0.1, sigma_max: 10 }, 3, undefined, [10, 5.05, 0.1, 0], [933.506653, 797.36377, 10.3821688]],
    ]);
  });

  it('DPM-Solver spans the whole training table and truncates the timesteps, as its int64 timesteps do (998 first)', () => {
    const [exponential, beta] = [{ ...DPM_SD15, use_exponential_sigmas: true }, { ...DPM_SD15, use_beta_sigmas: true }];
    const sigmas20 = {
      exponential: [14.6146469, 10.5363197, 7.59607983, 5.47633648, 3.94812346, 2.84636974, 2.05206871, 1.47942352, 1.06657922, 0.768942237, 0.554363072, 0.399663895, 0.288134664, 0.207728505, 0.149760306, 0.107968561, 0.0778391138, 0.0561175235, 0.0404575057, 0.0291675329, 0],
      beta: [14.6146469, 14.4152479, 13.9863262, 13.3927422, 12.6674452, 11.8355064, 10.9186268, 9.93679905, 8.90907764, 7.85399485, 6.78981924, 5.73473692, 4.70701551, 3.72518778, 2.80830836, 1.97636914, 1.25107253, 0.657488048, 0.22856681, 0.0291675329, 0],
    };
    expectSchedules([
      [exponential, 5, undefined, [14.6146469, 3.08898759, 0.652895987, 0.137997702, 0.0291675329, 0], [998, 680, 233, 20, 0]],
      [exponential, 20, undefined, sigmas20.exponential, [998, 942, 881, 814, 741, 659, 569, 472, 373, 277, 192, 124, 75, 43, 23, 12, 5, 2, 0, 0]],
      [beta, 5, undefined, [14.6146469, 12.0522642, 7.32190704, 2.59155011, 0.0291675329, 0], [998, 966, 874, 634, 0]],
      [beta, 20, undefined, sigmas20.beta, [998, 996, 991, 984, 975, 963, 949, 932, 912, 888, 859, 824, 781, 727, 655, 558, 421, 235, 51, 0]],
    ]);
    expect(schedule(beta, 20).timesteps.every(Number.isInteger)).toBe(true);
  });

  it("DPM-Solver's use_lu_lambdas spaces lambda evenly over the whole table, its timesteps rounded (999 first), the config's sigma_min and sigma_max aside", () => {
    const lu = { ...DPM_SD15, use_lu_lambdas: true };
    // The exponential spacing's noise levels (above), each given its nearest timestep.
    expectSchedules([
      [lu, 5, undefined, [14.6146469, 3.08898783, 0.652896047, 0.137997717, 0.0291675366, 0], [999, 681, 233, 20, 0]],
      [lu, 20, undefined, [14.6146469, 10.5363197, 7.59607983, 5.47633648, 3.94812346, 2.84636998, 2.05206895, 1.47942352, 1.06657922, 0.768942297, 0.554363132, 0.399663925, 0.288134694, 0.20772852, 0.149760321, 0.107968569, 0.0778391212, 0.0561175309, 0.0404575095, 0.0291675366, 0], [999, 943, 882, 815, 741, 659, 570, 473, 373, 277, 193, 125, 76, 43, 23, 12, 6, 3, 1, 0]],
      [{ ...lu, sigma_min: 0.1, sigma_max: 10 }, 5, undefined, [14.6146469, 3.08898783, 0.652896047, 0.137997717, 0.0291675366, 0], [999, 681, 233, 20, 0]],
      [lu, 1, undefined, [14.6146469, 0], [999]],
      // The cosine schedule's timesteps stay fractional until int64 truncates them, as its Karras ones do.
      [{ ...lu, beta_schedule: 'squaredcos_cap_v2' }, 5, undefined, [20291.3047, 481.378143, 11.4199123, 0.270918816, 0.00642710738, 0], [999, 997, 942, 160, 0]],
    ]);
    // diffusers takes Karras sigmas over it, and it over exponential or beta ones, refusing neither pair.
    const karras = schedule({ ...DPM_SD15, use_karras_sigmas: true }, 5);
    expect(schedule({ ...lu, use_karras_sigmas: true }, 5)).toEqual(karras);
    expect(schedule(lu, 5, undefined)).toEqual(schedule({ ...lu, use_beta_sigmas: true }, 5));
    expect(schedule(lu, 5, undefined)).toEqual(schedule({ ...lu, use_exponential_sigmas: true }, 5));
  });

  it('flow-matching Euler spaces the shifted grid between its ends (FLUX schnell and dev), Karras sigmas too', () => {
    expectSchedules([
      [{ ...SCHNELL, use_exponential_sigmas: true }, 4, undefined, [1, 0.629960537, 0.396850258, 0.25, 0], [1000, 629.96051, 396.85025, 250]],
      [{ ...SCHNELL, use_beta_sigmas: true }, 4, undefined, [1, 0.793440044, 0.456559956, 0.25, 0], [1000, 793.440063, 456.559967, 250]],
      [{ ...DEV, use_exponential_sigmas: true }, 4, 1.15, [1, 0.800439417, 0.640703261, 0.512844145, 0], [1000, 800.439392, 640.703247, 512.844116]],
      [{ ...DEV, use_beta_sigmas: true }, 4, 1.15, [1, 0.865830779, 0.647013366, 0.512844145, 0], [1000, 865.83075, 647.013367, 512.844116]],
      [{ ...DEV, use_karras_sigmas: true }, 4, 1.15, [1, 0.806063414, 0.6453017, 0.512844145, 0], [1000, 806.063416, 645.301697, 512.844116]],
    ]);
    let s = schedule({ ...DEV, use_beta_sigmas: true }, 28, 1.15);
    expectCloseArray(s.sigmas.slice(0, 6), [1, 0.993175447, 0.978423536, 0.957839668, 0.932405889, 0.902818561]);
    expectCloseArray(s.sigmas.slice(-4), [0.12629734, 0.111545429, 0.104720898, 0]);
    s = schedule({ ...DEV, use_exponential_sigmas: true }, 28, 1.15);
    expectCloseArray(s.sigmas.slice(0, 4), [1, 0.919824421, 0.846076965, 0.77824229]);
    expectCloseArray(s.timesteps.slice(-3), [123.772308, 113.848793, 104.720901]);
  });

  it('one step runs at the highest sigma of what it spaces, as numpy.linspace of one point is its start', () => {
    for (const spacing of ['use_exponential_sigmas', 'use_beta_sigmas']) {
      // Leading spacing's one timestep is 1 (0 + steps_offset): its sigma is both ends.
      expectCloseArray(schedule({ ...EULER_SD15, [spacing]: true }, 1).sigmas, [0.041314479, 0]);
      expect(schedule({ ...DPM_SD15, [spacing]: true }, 1)).toEqual({ sigmas: [expect.closeTo(14.6146469, 5), 0], timesteps: [998] });
      expect(schedule({ ...SCHNELL, [spacing]: true }, 1)).toEqual({ sigmas: [1, 0], timesteps: [1000] });
    }
  });

  it("takes the Beta quantile to scipy.stats.beta.ppf's digits, tails included", () => {
    const ps = [1e-6, 0.001, 0.1, 0.25, 0.5, 0.75, 0.9, 0.999];
    const scipy: Array<[number, number, number[]]> = [
      [0.6, 0.6, [1.8558824624053043e-10, 1.855873851745199e-5, 0.03958440558878085, 0.17568037865269498, 0.5000000000000001, 0.824319621347305, 0.9604155944112192, 0.9999814412614826]],
      [2, 3, [0.0004083594602042573, 0.013022947370814273, 0.14255931671003072, 0.24302208375607628, 0.3857275681323895, 0.5436782854190803, 0.6795394162781817, 0.9359618608971666]],
      [0.3, 4, [1.9049653209186645e-21, 1.9049653210024112e-11, 8.843870482363649e-5, 0.0018832461144910493, 0.019778314565049332, 0.08936406138899498, 0.2143738140841478, 0.7134437015152071]],
    ];
    for (const [a, b, expected] of scipy) {
      ps.forEach((p, i) => expect(Math.abs(betaQuantile(p, a, b) - expected[i]), `ppf(${p}, ${a}, ${b})`).toBeLessThanOrEqual(1e-12 * expected[i]));
    }
    expect([betaQuantile(0, 0.6, 0.6), betaQuantile(1, 0.6, 0.6)]).toEqual([0, 1]);
  });

  it('refuses two spacings at once, as diffusers does; the dpmpp_2m_karras name turns the others off', () => {
    for (const config of [EULER_SD15, DPM_SD15, SCHNELL]) {
      expect(() => createScheduler({ ...config, use_karras_sigmas: true, use_beta_sigmas: true })).toThrow(
        `${String(config._class_name)}: use_karras_sigmas and use_beta_sigmas are set together, and a schedule takes one of them: set the others to false`,
      );
    }
    const exponential = { ...DPM_SD15, use_exponential_sigmas: true };
    const karras = createScheduler(exponential, 'dpmpp_2m_karras') as DPMSolverMultistepScheduler;
    karras.setTimesteps(5);
    const plainKarras = createScheduler({ ...DPM_SD15, use_karras_sigmas: true }) as DPMSolverMultistepScheduler;
    plainKarras.setTimesteps(5);
    expect(karras.sigmas).toEqual(plainKarras.sigmas);
    // dpmpp_2m names the solver and leaves the model's own spacing as it is.
    const own = createScheduler(exponential, 'dpmpp_2m') as DPMSolverMultistepScheduler;
    own.setTimesteps(5);
    expect(own.timesteps).toEqual([998, 680, 233, 20, 0]);
    expect(schedulersRunning({ ...EULER_SD15, use_beta_sigmas: true }, 'vp')).toEqual({ running: schedulersFor('vp'), refused: [] });
  });
});

// ---------------------------------------------------------------------------------------------
// Full loops: diffusers' test_full_loop_* values
// ---------------------------------------------------------------------------------------------

describe('EulerDiscreteScheduler full loop (test_scheduler_euler.py)', () => {
  const config: SchedulerConfig = { num_train_timesteps: 1100, beta_start: 0.0001, beta_end: 0.02, beta_schedule: 'linear' };

  it('epsilon: 10.0807 / 0.0131', () => expectLoop(fullLoop(new EulerDiscreteScheduler(config)), '10.0807', '0.0131'));
  // diffusers' numbers here (sum 0.0002, mean 2.2676e-06: not even sum / 768) are float noise around 0,
  // asserted there within 1e-2 / 1e-3; the harness shrinks x by 1/sqrt(sigma^2 + 1) every step.
  it('v_prediction: ~0 (0.0002 / 2.2676e-06 within diffusers\' 1e-2 / 1e-3)', () => {
    const { sum, mean } = absStats(fullLoop(new EulerDiscreteScheduler({ ...config, prediction_type: 'v_prediction' })));
    expect(Math.abs(sum - 0.0002)).toBeLessThan(1e-2);
    expect(Math.abs(mean - 2.2676e-6)).toBeLessThan(1e-3);
    expect(sum).toBeLessThan(1e-3);
  });
  it('Karras sigmas: 124.52299499511719 / 0.16213932633399963', () =>
    expectLoop(fullLoop(new EulerDiscreteScheduler({ ...config, use_karras_sigmas: true })), '124.52299499511719', '0.16213932633399963'));
});

describe('DDIMScheduler full loop (test_scheduler_ddim.py, eta 0, clip_sample)', () => {
  const config: SchedulerConfig = { num_train_timesteps: 1000, beta_start: 0.0001, beta_end: 0.02, beta_schedule: 'linear', clip_sample: true };

  it('epsilon: 172.0067 / 0.223967', () => expectLoop(fullLoop(new DDIMScheduler(config)), '172.0067', '0.223967'));
  it('v_prediction: 52.5302 / 0.0684', () => expectLoop(fullLoop(new DDIMScheduler({ ...config, prediction_type: 'v_prediction' })), '52.5302', '0.0684'));
  it('clips the clean estimate to clip_sample_range: a last step (to alpha-bar 1) lands inside it, though the model predicts far outside', () => {
    const scheduler = new DDIMScheduler({ ...config, set_alpha_to_one: true, clip_sample_range: 0.5 });
    scheduler.setTimesteps(1);
    const out = scheduler.step(new Float32Array(8).fill(-40), 0, new Float32Array(8).fill(3), NO_NOISE);
    for (const v of out) expect(v).toBeCloseTo(0.5, 6);
  });
  it('set_alpha_to_one: 149.8295 / 0.1951', () =>
    expectLoop(fullLoop(new DDIMScheduler({ ...config, set_alpha_to_one: true, beta_start: 0.01 })), '149.8295', '0.1951'));
  it('no set_alpha_to_one: 149.0784 / 0.1941', () =>
    expectLoop(fullLoop(new DDIMScheduler({ ...config, set_alpha_to_one: false, beta_start: 0.01 })), '149.0784', '0.1941'));
  it('trained_betas: the list is the schedule, over beta_schedule (the same linear betas as a list: 172.0067 / 0.223967); fewer than the training timesteps are refused', () => {
    const betas = Array.from({ length: 1000 }, (_, i) => 0.0001 + (i * (0.02 - 0.0001)) / 999);
    expectLoop(fullLoop(new DDIMScheduler({ ...config, beta_schedule: 'unknown', trained_betas: betas })), '172.0067', '0.223967');
    // Past the list's end DDIM read no alpha-bar and drew NaN.
    expect(() => new DDIMScheduler({ ...config, trained_betas: betas.slice(0, 500) })).toThrow(
      'trained_betas has 500 betas, fewer than num_train_timesteps (1000): give one per training timestep, or set num_train_timesteps to 500',
    );
  });
});

describe('PNDMScheduler full loop (test_scheduler_pndm.py: PRK warm-up, then PLMS)', () => {
  const config: SchedulerConfig = { num_train_timesteps: 1000, beta_start: 0.0001, beta_end: 0.02, beta_schedule: 'linear' };

  it('epsilon: 198.1318 / 0.2580', () => expectLoop(fullLoop(new PNDMScheduler(config)), '198.1318', '0.2580'));
  it('v_prediction: 67.3986 / 0.0878', () => expectLoop(fullLoop(new PNDMScheduler({ ...config, prediction_type: 'v_prediction' })), '67.3986', '0.0878'));
  it('set_alpha_to_one: 230.0399 / 0.2995', () =>
    expectLoop(fullLoop(new PNDMScheduler({ ...config, set_alpha_to_one: true, beta_start: 0.01 })), '230.0399', '0.2995'));
  it('no set_alpha_to_one: 186.9482 / 0.2434', () =>
    expectLoop(fullLoop(new PNDMScheduler({ ...config, set_alpha_to_one: false, beta_start: 0.01 })), '186.9482', '0.2434'));

  it('skip_prk_steps: the repeated call restarts the first step with the mean of both outputs', () => {
    const s = new PNDMScheduler({ ...SD15 });
    s.setTimesteps(10);
    const x = dummySampleDeter();
    const e0 = dummyModel(x, s.timesteps[0]);
    const x1 = s.step(e0, 0, x, NO_NOISE);
    const e1 = dummyModel(x1, s.timesteps[1]);
    const redone = s.step(e1, 1, x1, NO_NOISE);

    const reference = new PNDMScheduler({ ...SD15 });
    reference.setTimesteps(10);
    const mean = e0.map((v, i) => 0.5 * v + 0.5 * e1[i]);
    const expected = reference.step(mean, 0, x, NO_NOISE);
    expectCloseArray(Array.from(redone), Array.from(expected), 1e-6);
  });
});

describe("DPMSolverMultistepScheduler with DEIS's and UniPC's spellings", () => {
  it("takes algorithm_type deis and solver_type logrho, bh1 or bh2 as dpmsolver++ and midpoint, as diffusers does", () => {
    const plain = createScheduler({ _class_name: 'DPMSolverMultistepScheduler' });
    plain.setTimesteps(20);
    for (const spelling of [{ algorithm_type: 'deis' }, { solver_type: 'logrho' }, { solver_type: 'bh1' }, { solver_type: 'bh2' }]) {
      const s = createScheduler({ _class_name: 'DPMSolverMultistepScheduler', ...spelling });
      s.setTimesteps(20);
      expect([...s.timesteps]).toEqual([...plain.timesteps]);
    }
    expect(() => createScheduler({ _class_name: 'DPMSolverMultistepScheduler', algorithm_type: 'sde-dpmsolver++' })).toThrow(/only algorithm_type dpmsolver\+\+/);
  });
});

describe('DPMSolverMultistepScheduler, Karras sigmas on the cosine schedule', () => {
  it('gives the model the timesteps diffusers does: left unrounded, then truncated as its int64 timesteps are', () => {
    const s = createScheduler({ _class_name: 'DPMSolverMultistepScheduler', beta_schedule: 'squaredcos_cap_v2', use_karras_sigmas: true });
    s.setTimesteps(10);
    // The first is 998: sigma_max through (sigma^(1/7))^7 comes back a hair below the largest table sigma,
    // whose float32 log (diffusers' log_sigmas) is rounded up, so it lands at 998.99999996.
    expect([...s.timesteps]).toEqual([998, 998, 998, 998, 997, 995, 983, 894, 259, 0]);
  });
});

describe('DPMSolverMultistepScheduler, lambda_min_clipped', () => {
  it("leaves out the timesteps whose lambda is below it, as diffusers' last_timestep does (cosine betas, -5.1)", () => {
    const clipped = (timestep_spacing: string) => {
      const s = createScheduler({ _class_name: 'DPMSolverMultistepScheduler', beta_schedule: 'squaredcos_cap_v2', lambda_min_clipped: -5.1, timestep_spacing }) as DPMSolverMultistepScheduler;
      s.setTimesteps(5);
      return s;
    };
    // diffusers' set_timesteps on the same config: the noisiest 4 timesteps are cut.
    expect([...clipped('linspace').timesteps]).toEqual([995, 796, 597, 398, 199]);
    expect(clipped('linspace').sigmas[0]).toBeCloseTo(160.41, 2);
    expect([...clipped('leading').timesteps]).toEqual([830, 664, 498, 332, 166]);
    expect([...clipped('trailing').timesteps]).toEqual([995, 795, 595, 395, 195]);
    // On SD's scaled_linear betas it cuts nothing.
    const sd = createScheduler({ _class_name: 'DPMSolverMultistepScheduler', beta_schedule: 'scaled_linear', beta_start: 0.00085, beta_end: 0.012, lambda_min_clipped: -5.1 });
    sd.setTimesteps(5);
    expect(sd.timesteps[0]).toBe(999);
  });
});

describe('DPMSolverMultistepScheduler full loop (test_scheduler_dpm_multi.py, dpmsolver++ 2M midpoint)', () => {
  const config: SchedulerConfig = {
    num_train_timesteps: 1000,
    beta_start: 0.0001,
    beta_end: 0.02,
    beta_schedule: 'linear',
    solver_order: 2,
    prediction_type: 'epsilon',
    algorithm_type: 'dpmsolver++',
    solver_type: 'midpoint',
    lower_order_final: false,
    final_sigmas_type: 'sigma_min',
  };

  it('epsilon: mean 0.3301', () => expectLoop(fullLoop(new DPMSolverMultistepScheduler(config)), null, '0.3301'));
  it('v_prediction: mean 0.2251', () => expectLoop(fullLoop(new DPMSolverMultistepScheduler({ ...config, prediction_type: 'v_prediction' })), null, '0.2251'));
  // 0.2096 dates from diffusers' 2023 implementation, which stepped between table sigmas at the rounded
  // Karras timesteps; today's diffusers steps between the exact Karras sigmas, which gives 0.209198
  // (its current code evaluated with numpy) and still passes its own 1e-3 tolerance.
  it('Karras sigmas + v_prediction: mean 0.2096 (diffusers tolerance 1e-3; current algorithm 0.209198)', () => {
    const { mean } = absStats(fullLoop(new DPMSolverMultistepScheduler({ ...config, prediction_type: 'v_prediction', use_karras_sigmas: true })));
    expect(Math.abs(mean - 0.2096)).toBeLessThan(1e-3);
    expectMatches(mean, '0.209198');
  });

  it('takes its last step at first order under lower_order_final below 15 steps only, as diffusers does', () => {
    const loop = (steps: number, lowerOrderFinal: boolean) => fullLoop(new DPMSolverMultistepScheduler({ ...config, lower_order_final: lowerOrderFinal }), steps);
    expect(loop(14, true)).not.toEqual(loop(14, false));
    expect(loop(15, true)).toEqual(loop(15, false));
  });

  it('Karras timesteps are whole numbers', () => {
    const s = new DPMSolverMultistepScheduler({ ...SD15, use_karras_sigmas: true });
    s.setTimesteps(20);
    expect(s.timesteps[0]).toBe(999);
    expect(s.timesteps.every(Number.isInteger)).toBe(true);
  });

  it('rejects the variants it does not implement', () => {
    expect(() => new DPMSolverMultistepScheduler({ algorithm_type: 'sde-dpmsolver++' })).toThrow(/dpmsolver\+\+/);
    expect(() => new DPMSolverMultistepScheduler({ solver_order: 3 })).toThrow(/solver_order/);
  });

  it("runs a fixed variance_type (DDPMScheduler's fixed_small, kept by a config switched from it) as none, as diffusers does; refuses a learned one", () => {
    // DDPMScheduler saves variance_type "fixed_small": every scheduler runs such a model's config, DPM-Solver included.
    const ddpm: SchedulerConfig = { ...SD15, _class_name: 'DDPMScheduler', variance_type: 'fixed_small', clip_sample: false };
    expect(schedulersRunning(standInFor(ddpm, 'vp')!.config, 'vp')).toEqual({ running: schedulersFor('vp'), refused: [] });
    expect(fullLoop(new DPMSolverMultistepScheduler({ ...config, variance_type: 'fixed_small' }))).toEqual(fullLoop(new DPMSolverMultistepScheduler(config)));
    for (const learned of ['learned', 'learned_range']) {
      expect(() => new DPMSolverMultistepScheduler({ ...config, variance_type: learned })).toThrow(`DPMSolverMultistepScheduler: variance_type "${learned}" is not supported`);
    }
  });
});

describe('LCMScheduler (test_scheduler_lcm.py)', () => {
  const config: SchedulerConfig = { num_train_timesteps: 1000, beta_start: 0.00085, beta_end: 0.012, beta_schedule: 'scaled_linear', prediction_type: 'epsilon' };

  it('one step: 18.7097 / 0.0244', () => expectLoop(fullLoop(new LCMScheduler(config), 1), '18.7097', '0.0244'));

  // test_full_loop_multistep (197.7616 / 0.2575) re-noises with torch.manual_seed(0) noise, which our
  // generator cannot reproduce; check the deterministic part and the noise injection instead.
  it('multistep: between steps x = sqrt(abar_next) * denoised + sqrt(1 - abar_next) * z', () => {
    const s = new LCMScheduler(config);
    s.setTimesteps(10);
    const x = dummySampleDeter();
    const out = dummyModel(x, s.timesteps[0]);
    const denoised = new LCMScheduler(config);
    denoised.setTimesteps(1); // one step returns the boundary-conditioned x0 at t = 999 as is
    const x0 = denoised.step(out, 0, x, NO_NOISE);

    const draws: number[] = [];
    const withoutNoise = s.step(out, 0, x, zeroNoise(BATCH, draws));
    expect(draws).toEqual([x.length / BATCH]);
    const ratios = Array.from(withoutNoise, (v, i) => v / x0[i]).filter(Number.isFinite);
    // abar at the next timestep (899 on the 10-step grid), from the same schedule.
    const next = ratios[0];
    ratios.forEach((r) => expect(r).toBeCloseTo(next, 5));

    const ones = { batchSize: BATCH, randn: (n: number) => new Float32Array(n * BATCH).fill(1) } as unknown as BatchNoise;
    const withOnes = s.step(out, 0, x, ones);
    const noiseScale = withOnes[0] - withoutNoise[0];
    expect(next ** 2 + noiseScale ** 2).toBeCloseTo(1, 5);
    expect(s.timesteps[1]).toBe(899);
  });

  it('last step returns the denoised sample without noise', () => {
    const s = new LCMScheduler(config);
    s.setTimesteps(4);
    const x = dummySampleDeter();
    expect(() => s.step(dummyModel(x, 259), 3, x, NO_NOISE)).not.toThrow();
  });
});

describe('EulerAncestralDiscreteScheduler', () => {
  // Every diffusers full-loop value for this scheduler (152.3192 / 0.1983 ...) depends on
  // torch.manual_seed(0) noise, which our generator cannot reproduce: we test the deterministic parts.
  const config: SchedulerConfig = { num_train_timesteps: 1100, beta_start: 0.0001, beta_end: 0.02, beta_schedule: 'linear' };

  it('without noise, a step is an Euler step down to sigma_down; the noise enters with std sigma_up', () => {
    const ancestral = new EulerAncestralDiscreteScheduler(config);
    const euler = new EulerDiscreteScheduler(config);
    ancestral.setTimesteps(10);
    euler.setTimesteps(10);
    expectCloseArray(ancestral.sigmas, euler.sigmas, 1e-12);
    expect(ancestral.timesteps).toEqual(euler.timesteps);
    expect(ancestral.initNoiseSigma).toBe(euler.initNoiseSigma);

    const [sigma, sigmaNext] = [ancestral.sigmas[0], ancestral.sigmas[1]];
    const sigmaUp = Math.sqrt((sigmaNext ** 2 * (sigma ** 2 - sigmaNext ** 2)) / sigma ** 2);
    const sigmaDown = Math.sqrt(sigmaNext ** 2 - sigmaUp ** 2);
    const x = dummySampleDeter().map((v) => v * ancestral.initNoiseSigma);
    const eps = dummyModel(ancestral.scaleModelInput(x, 0), ancestral.timesteps[0]);

    const deterministic = ancestral.step(eps, 0, x, zeroNoise(BATCH));
    const expected = x.map((v, i) => v + eps[i] * (sigmaDown - sigma));
    expectCloseArray(Array.from(deterministic), Array.from(expected), 1e-5);

    const ones = { batchSize: BATCH, randn: (n: number) => new Float32Array(n * BATCH).fill(1) } as unknown as BatchNoise;
    const noisy = ancestral.step(eps, 0, x, ones);
    expect(noisy[5] - deterministic[5]).toBeCloseTo(sigmaUp, 4);
  });

  it('the last step lands on x0 with no noise; every image draws its own noise', () => {
    const s = new EulerAncestralDiscreteScheduler(config);
    const draws: number[] = [];
    fullLoop(s, 10, zeroNoise(BATCH, draws));
    expect(draws).toEqual(new Array(9).fill(768 / BATCH));

    // Same seed, same image, whatever else is in the batch.
    const single = fullLoopItems(new EulerAncestralDiscreteScheduler(config), [7]);
    const pair = fullLoopItems(new EulerAncestralDiscreteScheduler(config), [7, 8]);
    expect(Array.from(pair.subarray(0, single.length))).toEqual(Array.from(single));
  });

  it('has no `sample` prediction, like diffusers', () => {
    expect(() => new EulerAncestralDiscreteScheduler({ prediction_type: 'sample' })).toThrow(/prediction_type/);
  });
});

/** A loop over one dummy item per seed, with real per-image generators. */
function fullLoopItems(scheduler: Scheduler, seeds: number[]): Float32Array {
  const item = dummySampleDeter().subarray(0, 192);
  const noise = new BatchNoise(seeds.map((seed) => new Rng(seed)));
  scheduler.setTimesteps(5);
  let x: Float32Array = new Float32Array(item.length * seeds.length);
  seeds.forEach((_, b) => x.set(item.map((v) => v * scheduler.initNoiseSigma), b * item.length));
  scheduler.timesteps.forEach((t, i) => {
    x = scheduler.step(dummyModel(scheduler.scaleModelInput(x, i), t), i, x, noise);
  });
  return x;
}

// ---------------------------------------------------------------------------------------------
// Zero terminal SNR (rescale_betas_zero_snr)
// ---------------------------------------------------------------------------------------------

/**
 * The numbers below were computed with numpy 2.4 following diffusers 0.40.0.dev0 (commit 58eb52c):
 * rescale_zero_terminal_snr of scheduling_ddim.py on torch's float32 betas (cumprod accumulated in
 * double, as torch's CPU kernel), abar_999 set to 2^-24 where scheduling_euler_discrete.py,
 * _euler_ancestral_discrete.py and _dpmsolver_multistep.py set it, then their set_timesteps and step on
 * the harness above (noise of zeros where the scheduler draws).
 */
describe('zero terminal SNR (rescale_betas_zero_snr), as SD 2.1 fine-tunes set it', () => {
  const ZSNR: SchedulerConfig = {
    _class_name: 'DDIMScheduler',
    ...SD15,
    prediction_type: 'v_prediction',
    timestep_spacing: 'trailing',
    rescale_betas_zero_snr: true,
  };
  const epsilon = { ...ZSNR, prediction_type: 'epsilon' };

  it('rescales abar_t to end at exactly 0 and start where it did', () => {
    // Within float32's last bits: how torch's linspace rounds the betas is not reproduced bit for bit.
    const betas = { num_train_timesteps: 1000, beta_start: 0.00085, beta_end: 0.012, beta_schedule: 'scaled_linear', rescale_betas_zero_snr: true };
    const rescaled = trainingAlphasCumprod(betas);
    expectCloseArray([0, 1, 500, 998].map((t) => rescaled[t]), [0.9991499781608582, 0.9982334971427917, 0.24101853370666504, 1.9679627882851491e-7], 1e-6);
    expect(rescaled[999]).toBe(0);
    // Without it the schedule ends at 0.00466: x_T keeps a trace of the picture (the paper's flaw).
    const plain = trainingAlphasCumprod({ ...betas, rescale_betas_zero_snr: false });
    expect([plain[0], plain[999]]).toEqual([rescaled[0], Math.fround(0.00466009508818388)]);
    // DDPM's linear betas too.
    const linear = trainingAlphasCumprod({ beta_start: 0.0001, beta_end: 0.02, beta_schedule: 'linear', num_train_timesteps: 1000, rescale_betas_zero_snr: true });
    expectCloseArray([linear[0], linear[500]], [0.9998999834060669, 0.07524622976779938], 1e-6);
    expect(linear[999]).toBe(0);
  });

  it('Euler-type schedulers start from sigma ~4096 (abar 2^-24), not an infinite one', () => {
    const euler = new EulerDiscreteScheduler(ZSNR);
    const expected4 = [4095.999755859375, 5.398740768432617, 1.7680810689926147, 0.7270563840866089, 0];
    euler.setTimesteps(4);
    expect(euler.timesteps).toEqual([999, 749, 499, 249]);
    expectCloseArray(euler.sigmas, expected4, 1e-6);
    expect(euler.initNoiseSigma).toBeCloseTo(4096, 3);
    for (const s of [new EulerAncestralDiscreteScheduler(ZSNR), new DPMSolverMultistepScheduler(ZSNR)]) {
      s.setTimesteps(4);
      expect(s.timesteps).toEqual([999, 749, 499, 249]);
      expectCloseArray(s.sigmas, expected4, 1e-6);
    }
    euler.setTimesteps(1);
    expectCloseArray(euler.sigmas, [4095.999755859375, 0], 1e-6);

    const linspace = new EulerDiscreteScheduler({ ...ZSNR, timestep_spacing: 'linspace' });
    linspace.setTimesteps(25);
    expectCloseArray(linspace.sigmas.slice(0, 3), [4095.999755859375, 49.43324279785156, 22.568805694580078], 1e-6);
    expect(linspace.sigmas.at(-2)).toBeCloseTo(0.029167532920837402, 7);
    // Leading spacing never visits timestep 999: it starts at 960 for 25 steps, sqrt(sigma^2 + 1) = 53.0703.
    const leading = new EulerDiscreteScheduler({ ...ZSNR, timestep_spacing: 'leading', steps_offset: 0 });
    leading.setTimesteps(25);
    expect(leading.timesteps.slice(0, 2)).toEqual([960, 920]);
    expectCloseArray(leading.sigmas.slice(0, 2), [53.06084442138672, 24.000242233276367], 1e-6);
    expect(leading.initNoiseSigma).toBeCloseTo(53.07026672363281, 4);
  });

  describe('DDIM (abar_999 stays 0: x0 = -v there)', () => {
    it('trailing, v_prediction: 1, 4, 25 and 50 steps', () => {
      for (const [steps, sum, mean] of [
        [1, '371.772643496166', '0.4840789628856328'],
        [4, '24.951021573040634', '0.03248830933989666'],
        [25, '73.14806616256828', '0.09524487781584412'],
        [50, '78.18818129273131', '0.10180752772491057'],
      ] as const) {
        expectLoop(fullLoop(new DDIMScheduler(ZSNR), steps), sum, mean);
      }
    });

    it('leading (steps_offset 1): v_prediction, and epsilon, which never meets timestep 999 there', () => {
      const leading = { ...ZSNR, timestep_spacing: 'leading' };
      expectLoop(fullLoop(new DDIMScheduler(leading), 4), '32.54780198852677', '0.042379950505894236');
      expectLoop(fullLoop(new DDIMScheduler({ ...leading, prediction_type: 'epsilon' }), 50), '198.21280784439296', '0.25808959354738664');
    });

    it('refuses epsilon prediction on a schedule that visits abar 0, where diffusers divides by 0', () => {
      const s = new DDIMScheduler(epsilon);
      expect(() => s.setTimesteps(4)).toThrow(
        'DDIMScheduler: prediction_type "epsilon" cannot denoise timestep 999, which is pure noise (alpha-bar 0, as rescale_betas_zero_snr makes the last one)',
      );
      // A sample prediction gives x0 there as anywhere else.
      const sample = new DDIMScheduler({ ...ZSNR, prediction_type: 'sample' });
      expect(Array.from(fullLoop(sample, 4)).every(Number.isFinite)).toBe(true);
    });
  });

  it('Euler, trailing, 1 and 4 steps (the one step goes from sigma 4096 straight to 0)', () => {
    expectLoop(fullLoop(new EulerDiscreteScheduler(ZSNR), 1), '383.11646947066765', '0.49884956962326515');
    expectLoop(fullLoop(new EulerDiscreteScheduler(epsilon), 1), '1568861.559214592', '2042.7884885606666');
    expectLoop(fullLoop(new EulerDiscreteScheduler(ZSNR), 4), '0.025012205686266498', '3.256797615399284e-05');
    expectLoop(fullLoop(new EulerDiscreteScheduler(epsilon), 4), '3205.0957401543856', '4.173301744992689');
  });

  it('Euler ancestral, trailing, 4 steps with noise of zeros', () => {
    expectLoop(fullLoop(new EulerAncestralDiscreteScheduler(ZSNR), 4, zeroNoise(BATCH)), '0.49451973588475084', '0.000643905906099936');
    expectLoop(fullLoop(new EulerAncestralDiscreteScheduler(epsilon), 4, zeroNoise(BATCH)), '55790.928502231836', '72.6444381539477');
  });

  it('DPM-Solver++ 2M, trailing: 1, 4 and 25 steps', () => {
    for (const [steps, prediction, sum, mean] of [
      [1, 'v_prediction', '383.0228720632149', '0.4987276979989777'],
      [1, 'epsilon', '1570.815841945354', '2.045333127533013'],
      [4, 'v_prediction', '28.84754216269357', '0.03756190385767392'],
      [4, 'epsilon', '241.20949113345705', '0.31407485824668885'],
      [25, 'v_prediction', '77.98942909686593', '0.10154873580321085'],
      [25, 'epsilon', '205.0388859974919', '0.26697771614256754'],
    ] as const) {
      expectLoop(fullLoop(new DPMSolverMultistepScheduler({ ...ZSNR, prediction_type: prediction }), steps), sum, mean);
    }
  });

  it('LCM, v_prediction: 1 and 4 steps (noise of zeros); epsilon refused as for DDIM', () => {
    const lcm = { num_train_timesteps: 1000, beta_start: 0.00085, beta_end: 0.012, beta_schedule: 'scaled_linear', prediction_type: 'v_prediction', rescale_betas_zero_snr: true };
    expectLoop(fullLoop(new LCMScheduler(lcm), 1), '383.1164999930188', '0.4988496093659099');
    expectLoop(fullLoop(new LCMScheduler(lcm), 4, zeroNoise(BATCH)), '1.563503713548016', '0.002035812127015646');
    expect(() => new LCMScheduler({ ...lcm, prediction_type: 'epsilon' }).setTimesteps(4)).toThrow(/LCMScheduler: prediction_type "epsilon" cannot denoise timestep 999/);
    // Below strength 1 its image-to-image picks among less noisy timesteps, which epsilon can denoise.
    expect(() => new LCMScheduler({ ...lcm, prediction_type: 'epsilon' }).setTimesteps(4, { strength: 0.5 })).not.toThrow();
  });

  it("PNDM is refused: diffusers' PNDMScheduler has no such option (and divides by sqrt(abar_t))", () => {
    expect(() => new PNDMScheduler(ZSNR)).toThrow('PNDMScheduler: rescale_betas_zero_snr=true is not supported');
    expect(() => createScheduler(ZSNR, 'pndm')).toThrow('PNDMScheduler: rescale_betas_zero_snr=true is not supported');
    expect(() => new PNDMScheduler({ ...ZSNR, rescale_betas_zero_snr: false })).not.toThrow();
  });

  it('a model lists the schedulers that run its config: not PNDM, nor DDIM and LCM for an epsilon model, each left out with its class\'s reason', () => {
    expect(schedulersRunning(ZSNR, 'vp')).toEqual({
      running: schedulersFor('vp').filter((name) => name !== 'pndm'),
      refused: [{ name: 'pndm', reason: 'PNDMScheduler: rescale_betas_zero_snr=true is not supported' }],
    });
    const euler = schedulersRunning({ ...epsilon, _class_name: 'EulerDiscreteScheduler' }, 'vp');
    expect(euler.running).toEqual(['euler', 'euler_a', 'dpmpp_2m', 'dpmpp_2m_karras']);
    expect(euler.refused).toEqual([
      { name: 'pndm', reason: 'PNDMScheduler: rescale_betas_zero_snr=true is not supported' },
      { name: 'ddim', reason: expect.stringMatching(/^DDIMScheduler: prediction_type "epsilon" cannot denoise timestep 999/) },
      { name: 'lcm', reason: expect.stringMatching(/^LCMScheduler: prediction_type "epsilon" cannot denoise timestep 999/) },
    ]);
    expect(refusalNote(euler.refused)).toMatch(/^schedulers not offered, as its scheduler_config\.json does not run on them: pndm \(PNDMScheduler: rescale_betas_zero_snr=true is not supported\); ddim \(DDIMScheduler: /);
    expect(schedulersRunning(SD15, 'vp')).toEqual({ running: schedulersFor('vp'), refused: [] });
    expect(refusalNote([])).toBeUndefined();
  });
});

// ---------------------------------------------------------------------------------------------
// Registry
// ---------------------------------------------------------------------------------------------

describe('scheduler registry', () => {
  it('names and kinds', () => {
    expect([...SCHEDULER_NAMES].sort()).toEqual(['ddim', 'dpmpp_2m', 'dpmpp_2m_karras', 'euler', 'euler_a', 'flow_match_euler', 'lcm', 'pndm']);
    expect(schedulersFor('flow')).toEqual(['flow_match_euler']);
    expect(schedulersFor('vp')).not.toContain('flow_match_euler');
    expect(schedulersFor('vp')).toHaveLength(SCHEDULER_NAMES.length - 1);
  });

  it('picks the class of scheduler_config.json', () => {
    expect(createScheduler(SD15)).toBeInstanceOf(PNDMScheduler);
    expect(createScheduler({ _class_name: 'FlowMatchEulerDiscreteScheduler' })).toBeInstanceOf(FlowMatchEulerDiscreteScheduler);
  });

  it('an override keeps the fields the config names (SD1.5 as saved by diffusers + euler = leading, offset 1)', () => {
    const s = createScheduler({ ...SD15, timestep_spacing: 'leading' }, 'euler');
    expect(s).toBeInstanceOf(EulerDiscreteScheduler);
    s.setTimesteps(50);
    expect(s.timesteps[0]).toBe(981);
    expect(s.timesteps.at(-1)).toBe(1);
    // scaled_linear betas: sigma(981) of SD1.5, and the `leading` init-noise rule.
    const sigma = (s as EulerDiscreteScheduler).sigmas[0];
    expect(sigma).toBeGreaterThan(12);
    expect(sigma).toBeLessThan(14.6);
    expect(s.initNoiseSigma).toBeCloseTo(Math.sqrt(sigma ** 2 + 1), 10);
  });

  it("an override takes its own class's defaults for what the config does not name, as diffusers' from_config does (SD1.5 as published + euler = linspace)", () => {
    // runwayml's scheduler_config.json names no timestep_spacing: PNDM's default (leading) is not carried over.
    const s = createScheduler(SD15, 'euler') as EulerDiscreteScheduler;
    s.setTimesteps(20);
    expect(s.timesteps[0]).toBeCloseTo(999, 6);
    expect(s.timesteps[1]).toBeCloseTo(946.42, 2);
    expect(s.timesteps.at(-1)).toBeCloseTo(0, 6);
    // sigma(999) of SD 1.5's betas, and the linspace init-noise rule (the largest sigma itself).
    expect(s.sigmas[0]).toBeCloseTo(14.6146, 3);
    expect(s.initNoiseSigma).toBe(s.sigmas[0]);
    const dpm = createScheduler(SD15, 'dpmpp_2m');
    dpm.setTimesteps(20);
    expect([dpm.timesteps[0], dpm.timesteps[1], dpm.timesteps.at(-1)]).toEqual([999, 949, 50]);
  });

  it('the name fixes what it names (dpmpp_2m_karras turns Karras sigmas on)', () => {
    const karras = createScheduler({ ...SD15, _class_name: 'DPMSolverMultistepScheduler', algorithm_type: 'sde-dpmsolver++' }, 'dpmpp_2m_karras');
    expect(karras).toBeInstanceOf(DPMSolverMultistepScheduler);
    karras.setTimesteps(10);
    expect((karras as DPMSolverMultistepScheduler).sigmas[0]).toBeCloseTo(14.614647, 4);
    expect((karras as DPMSolverMultistepScheduler).sigmas[1]).toBeLessThan(10);
    const pndm = createScheduler({ ...SD15, skip_prk_steps: false }, 'pndm');
    pndm.setTimesteps(10);
    expect(pndm.timesteps).toHaveLength(11);
  });

  it('errors list the supported names', () => {
    expect(() => createScheduler({ _class_name: 'HeunDiscreteScheduler' })).toThrow(/HeunDiscreteScheduler.*euler_a.*dpmpp_2m_karras/);
    expect(() => createScheduler(SD15, 'heun')).toThrow(/unknown scheduler "heun".*pndm, ddim, euler, euler_a, dpmpp_2m, dpmpp_2m_karras, lcm, flow_match_euler/);
    expect(() => createScheduler(SD15, 'flow_match_euler')).toThrow(/does not fit a vp model.*pndm/);
    expect(() => createScheduler({ _class_name: 'FlowMatchEulerDiscreteScheduler' }, 'euler')).toThrow(/flow_match_euler/);
  });
});
