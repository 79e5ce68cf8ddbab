/**
 * What image-to-image needs of the schedulers: diffusers' strength -> first step (get_timesteps), the
 * noising of a clean sample to that step (add_noise / scale_noise) with the noise levels diffusers
 * uses, and a loop that starts there. The noise levels are computed here from the SD 1.5 training
 * schedule on their own, not through the schedulers' code.
 */
import { describe, expect, it } from 'vitest';
import { BatchNoise } from '../src/runtime/random.js';
import { denoise, latentMask, startingLatents, type PictureEncoder } from '../src/pipelines/denoise.js';
import type { RgbImage } from '../src/runtime/types.js';
import { createScheduler, fewestSteps, honoursStrength, stepsRun, strengthStart } from '../src/schedulers/index.js';
import type { SchedulerConfig } from '../src/schedulers/scheduler.js';

const SD15: SchedulerConfig = {
  beta_start: 0.00085,
  beta_end: 0.012,
  beta_schedule: 'scaled_linear',
  num_train_timesteps: 1000,
  steps_offset: 1,
  timestep_spacing: 'leading',
  set_alpha_to_one: false,
  skip_prk_steps: true,
  clip_sample: false,
  prediction_type: 'epsilon',
};

/** abar_t of SD's scaled-linear betas: cumprod(1 - linspace(sqrt(b0), sqrt(b1), 1000)^2). */
function alphaCumprod(t: number): number {
  const [a, b] = [Math.sqrt(0.00085), Math.sqrt(0.012)];
  let product = 1;
  for (let i = 0; i <= t; i++) product *= 1 - (a + ((b - a) * i) / 999) ** 2;
  return product;
}

const x0 = Float32Array.from({ length: 64 }, (_, i) => Math.sin(i));
const n = Float32Array.from({ length: 64 }, (_, i) => Math.cos(3 * i));
const NO_DRAWS = { batchSize: 1, randn: () => new Float32Array(64) } as unknown as BatchNoise;

function expectClose(actual: Float32Array, expected: (i: number) => number, tolerance = 1e-5) {
  let worst = 0;
  actual.forEach((v, i) => (worst = Math.max(worst, Math.abs(v - expected(i)))));
  expect(worst).toBeLessThan(tolerance);
}

describe('strength', () => {
  it("starts where diffusers' Stable Diffusion pipelines' get_timesteps does: floor(N x strength) steps run", () => {
    expect(strengthStart(50, 0.75, 'vp')).toBe(13); // init_timestep = int(37.5) = 37
    expect(strengthStart(4, 0.5, 'vp')).toBe(2);
    expect(strengthStart(10, 1, 'vp')).toBe(0);
    expect(strengthStart(3, 0.34, 'vp')).toBe(2);
    expect(strengthStart(4, 0.6, 'vp')).toBe(2);
  });

  it("starts where diffusers' FLUX pipelines' get_timesteps does: at int(N - N x strength), unrounded products in double precision", () => {
    // schnell's 4 steps: 0.6 runs 3 from sigma 0.75 (SD's rule would run 2), 0.3 (the variations default) runs 2, 0.2 still runs 1.
    expect([0.6, 0.3, 0.2, 1].map((strength) => strengthStart(4, strength, 'flow'))).toEqual([1, 2, 3, 0]);
    // 3 x 0.7 is 2.0999999999999996 in doubles, as in Python: all 3 run (SD's rule runs 2).
    expect([strengthStart(3, 0.7, 'flow'), strengthStart(3, 0.7, 'vp')]).toEqual([0, 1]);
    expect(strengthStart(50, 0.75, 'flow')).toBe(12);
    // One step at 0.2 runs too, but from int(1 - 0.2) = 0, sigma 1: noise alone, nothing of the picture.
    // The server asks for steps that start from the picture (4 at the edits' default 0.8 do not: 5).
    expect([fewestSteps(0.2, 'flow'), fewestSteps(0.8, 'flow'), fewestSteps(0.999, 'flow')]).toEqual([2, 5, undefined]);
    expect([honoursStrength(4, 0.8, 'flow'), honoursStrength(5, 0.8, 'flow'), honoursStrength(4, 1, 'flow'), honoursStrength(4, 1, 'vp')]).toEqual([false, true, true, true]);
    expect(fewestSteps(0.2, 'vp')).toBe(5);
    expect(stepsRun(4, 0.2, 'flow')).toBe(1);
  });

  it("a latent consistency model's own pipeline runs every step, LCMScheduler picking them among the timesteps the strength leaves, as diffusers' LatentConsistencyModelImg2ImgPipeline does", () => {
    expect([strengthStart(4, 0.5, 'consistency'), stepsRun(4, 0.5, 'consistency'), fewestSteps(0.01, 'consistency')]).toEqual([0, 4, 1]);
    const picked = (steps: number, strength: number) => {
      const lcm = createScheduler({ _class_name: 'LCMScheduler' });
      lcm.setTimesteps(steps, { strength });
      return [...lcm.timesteps];
    };
    // diffusers' LCMScheduler.set_timesteps(N, strength=s) with original_inference_steps 50.
    expect(picked(4, 0.5)).toEqual([499, 379, 259, 139]);
    expect(picked(8, 0.3)).toEqual([299, 279, 239, 199, 159, 119, 79, 39]);
    expect(picked(6, 0.7)).toEqual([699, 599, 479, 359, 239, 119]);
    // More steps than the strength leaves distilled timesteps: refused (int(50 x 0.1) = 5).
    expect(() => picked(6, 0.1)).toThrow(/steps must be between 1 and 5, the distilled timesteps strength 0\.1 leaves/);
  });

  it('refuses a strength that leaves no step, or one out of range', () => {
    expect(() => strengthStart(4, 0.2, 'vp')).toThrow(/leaves no step/);
    expect(() => strengthStart(4, 0, 'flow')).toThrow(/\(0, 1\]/);
    expect(() => strengthStart(4, 1.5, 'vp')).toThrow(/\(0, 1\]/);
  });
});

describe('where an edit starts (startingLatents)', () => {
  // One item, 16x16 pixels on a 4x2x2 latent grid (64 values, as x0 and n); the encoder answers x0.
  const [W, H] = [16, 16];
  const shape = { channels: 4, height: 2, width: 8 };
  const picture: RgbImage = { pixels: new Uint8Array(W * H * 3).fill(200), width: W, height: H };
  const item = (extra: object = {}) => ({ prompt: '', negativePrompt: '', seed: 7, image: picture, initialNoise: n, ...extra });
  const repaintAll = new Uint8Array(W * H).fill(255);
  const euler = () => {
    const s = createScheduler({ ...SD15, _class_name: 'EulerDiscreteScheduler' });
    s.setTimesteps(30);
    return s;
  };
  /** An encoder whose pictures encode to x0, and which samples no posterior. */
  const toX0: PictureEncoder = { encode: async () => x0.slice(), drawWithoutEncoding: async () => undefined };

  it("inpainting at strength 1 (a masked edit's default) starts from pure noise times the starting sigma, as diffusers' SD inpainting pipelines do, with no trace of the picture", async () => {
    const s = euler();
    const batch = { steps: 30, strength: 1, width: W, height: H, items: [item({ mask: repaintAll })] };
    const start = await startingLatents(batch, s, BatchNoise.forItems(batch.items), shape, toX0, { rule: 'vp' });
    expect(start.call).toBe(0);
    expectClose(start.latents, (i) => n[i] * s.initNoiseSigma, 1e-4);
    // The kept area is still put back from the picture, noised as the steps go.
    expect(start.keep?.original).toEqual(x0);
  });

  it('below strength 1, and without a mask, it starts from the picture noised to its first step', async () => {
    const s = euler();
    for (const [strength, mask] of [[0.8, repaintAll], [1, undefined]] as const) {
      const batch = { steps: 30, strength, width: W, height: H, items: [item(mask && { mask })] };
      const start = await startingLatents(batch, s, BatchNoise.forItems(batch.items), shape, toX0, { rule: 'vp' });
      expectClose(start.latents, (i) => s.addNoise(x0, n, start.call)[i]);
    }
  });

  it("draws from the generators in diffusers' order: the picture's posterior, the noise, then the masked picture's posterior, which an inpainting UNet at strength 1 alone draws (its picture is never encoded)", async () => {
    // An encoder that samples its posterior draws from the items' generators (Optimum's latent_parameters).
    const seeded = { prompt: '', negativePrompt: '', seed: 7, rng: 'torch' as const, image: picture, mask: repaintAll };
    const fresh = BatchNoise.forItems([seeded]);
    const draws = Array.from({ length: 4 }, () => fresh.initial(64));
    for (const inpaintingUnet of [false, true]) {
      const s = euler();
      const noise = BatchNoise.forItems([seeded]);
      let [encoded, drawnOnly] = [0, 0];
      const sampling: PictureEncoder = {
        encode: async () => {
          encoded++;
          noise.randn(64);
          return x0.slice();
        },
        drawWithoutEncoding: async (perItem) => {
          drawnOnly++;
          noise.randn(perItem);
        },
      };
      const start = await startingLatents({ steps: 30, strength: 1, width: W, height: H, items: [seeded] }, s, noise, shape, sampling, { rule: 'vp', inpaintingUnet });
      expect([encoded, drawnOnly]).toEqual(inpaintingUnet ? [0, 0] : [1, 1]);
      expectClose(start.latents, (i) => draws[inpaintingUnet ? 0 : 1][i] * s.initNoiseSigma, 1e-4);
      // The noise of the steps that follow: diffusers' fourth draw after a 4-channel UNet's start (the
      // inpainting UNet's pipeline encodes the masked picture next, its second).
      expect(noise.randn(64)).toEqual(draws[inpaintingUnet ? 1 : 3]);
    }
  });

  it('decides each item on its own: an unmasked edit merged into a batch with a masked one (the batcher merges them) starts and draws as it would alone', async () => {
    const masked = { prompt: '', negativePrompt: '', seed: 7, rng: 'torch' as const, image: picture, mask: repaintAll };
    const plain = { prompt: '', negativePrompt: '', seed: 8, rng: 'torch' as const, image: picture };
    // Each item's own sequence of draws, from a generator of its seed alone.
    const drawsOf = (seeded: typeof plain) => {
      const own = BatchNoise.forItems([seeded]);
      return Array.from({ length: 4 }, () => own.initial(64));
    };
    const [a, b] = [drawsOf(masked), drawsOf(plain)];
    for (const inpaintingUnet of [false, true]) {
      const s = euler();
      const noise = BatchNoise.forItems([masked, plain]);
      // An encoder that samples each picture's posterior from its item's generator, drawing nothing for an item it does not encode.
      const sampling: PictureEncoder = {
        encode: async (images) => {
          noise.randn(64, images.map((image) => image !== undefined));
          return Float32Array.from({ length: 128 }, (_, i) => (images[i >> 6] ? x0[i & 63] : 0));
        },
        drawWithoutEncoding: async (perItem, drawing) => void noise.randn(perItem, drawing),
      };
      const start = await startingLatents({ steps: 30, strength: 1, width: W, height: H, items: [masked, plain] }, s, noise, shape, sampling, { rule: 'vp', inpaintingUnet });
      // The masked item: pure noise, its first draw on an inpainting UNet (nothing encoded), else its second.
      expectClose(start.latents.subarray(0, 64), (i) => a[inpaintingUnet ? 0 : 1][i] * s.initNoiseSigma, 1e-4);
      // The unmasked one: its picture noised to the first step with its second draw (the first sampled its posterior), on any UNet.
      const alone = s.addNoise(x0, b[1], 0);
      expectClose(start.latents.subarray(64), (i) => alone[i], 1e-4);
      // What the items draw next: the masked one after its masked picture's posterior (skipped or, on an
      // inpainting UNet, still to come); the unmasked one right after its noise, as alone.
      const next = noise.randn(64);
      expect(next.subarray(0, 64)).toEqual(a[inpaintingUnet ? 1 : 3]);
      expect(next.subarray(64)).toEqual(b[2]);
    }
  });

  it('a FLUX edit starts where its pipeline does: 4 steps at strength 0.6 run 3', async () => {
    const s = createScheduler({ _class_name: 'FlowMatchEulerDiscreteScheduler', num_train_timesteps: 1000, shift: 1 });
    s.setTimesteps(4);
    const batch = { steps: 4, strength: 0.6, width: W, height: H, items: [item({ mask: repaintAll })] };
    const start = await startingLatents(batch, s, BatchNoise.forItems(batch.items), shape, toX0, { rule: 'flow' });
    expect(start.call).toBe(1);
    expectClose(start.latents, (i) => 0.25 * x0[i] + 0.75 * n[i]);
  });
});

describe('the mask on the latent grid', () => {
  it("takes each latent pixel from the first image pixel it covers, as diffusers' inpainting pipelines shrink their mask (torch's interpolate, mode 'nearest')", () => {
    // 16x16 pixels on a 2x2 grid: rows 0-7 repaint from column 4 on (half of the first block, not its
    // top-left pixel); rows 8-15 repaint only the pixel (8, 0), the top left of their first block.
    const mask = Uint8Array.from({ length: 256 }, (_, i) => {
      const [y, x] = [Math.floor(i / 16), i % 16];
      return (y < 8 ? x >= 4 : y === 8 && x === 0) ? 255 : 0;
    });
    // torch.nn.functional.interpolate(mask, size=(2, 2)) picks pixel (floor(8 y), floor(8 x)).
    const expected = [0, 1, 1, 0];
    const latent = latentMask(mask, { width: 16, height: 16 }, { channels: 3, height: 2, width: 2 }, 0);
    expect([...latent]).toEqual([...expected, ...expected, ...expected]);
  });
});

describe('addNoise at the first step of image-to-image', () => {
  it('ddim and pndm: sqrt(abar) x0 + sqrt(1 - abar) noise at the sliced timestep (721 for 50 steps at 0.75)', () => {
    for (const name of ['ddim', 'pndm'] as const) {
      const s = createScheduler({ ...SD15, _class_name: name === 'ddim' ? 'DDIMScheduler' : 'PNDMScheduler' });
      s.setTimesteps(50);
      const start = strengthStart(50, 0.75, 'vp');
      // PNDM repeats its second timestep, so its list is shifted by one from there on, as in diffusers.
      expect(s.timesteps[start]).toBe(name === 'ddim' ? 721 : 741);
      const abar = alphaCumprod(s.timesteps[start]);
      expectClose(s.addNoise(x0, n, start), (i) => Math.sqrt(abar) * x0[i] + Math.sqrt(1 - abar) * n[i]);
    }
  });

  it('euler: x0 + sigma noise, sigma = sqrt((1 - abar) / abar) at the step', () => {
    const s = createScheduler({ ...SD15, _class_name: 'EulerDiscreteScheduler' });
    s.setTimesteps(20);
    const start = strengthStart(20, 0.6, 'vp');
    const abar = alphaCumprod(s.timesteps[start]);
    expectClose(s.addNoise(x0, n, start), (i) => x0[i] + Math.sqrt((1 - abar) / abar) * n[i], 1e-4);
  });

  it('dpm++: the same noise level in the VP form it steps in', () => {
    const s = createScheduler({ ...SD15, _class_name: 'DPMSolverMultistepScheduler' });
    s.setTimesteps(20);
    const start = strengthStart(20, 0.6, 'vp');
    const abar = alphaCumprod(s.timesteps[start]);
    expectClose(s.addNoise(x0, n, start), (i) => Math.sqrt(abar) * x0[i] + Math.sqrt(1 - abar) * n[i], 1e-4);
  });

  it('flow matching: (1 - sigma) x0 + sigma noise, sigma = t / 1000', () => {
    const s = createScheduler({ _class_name: 'FlowMatchEulerDiscreteScheduler', num_train_timesteps: 1000, shift: 1 });
    s.setTimesteps(4);
    const start = strengthStart(4, 0.5, 'flow');
    const sigma = s.timesteps[start] / 1000;
    expect(sigma).toBeCloseTo(0.5, 6);
    expectClose(s.addNoise(x0, n, start), (i) => (1 - sigma) * x0[i] + sigma * n[i]);
  });
});

/**
 * The model a single clean sample x0 implies: its exact noise (or velocity) prediction at x, t. The
 * model input of every VP scheduler is the variance-preserving sample sqrt(abar) x0 + sqrt(1 - abar) eps.
 */
function oracle(flow: boolean, velocity = false, alphaCumprodAt = alphaCumprod) {
  return async (x: Float32Array, t: number): Promise<Float32Array> => {
    if (flow) {
      const sigma = t / 1000;
      return x.map((v, i) => (v - x0[i]) / sigma); // v = noise - x0, with noise = (x - (1 - sigma) x0) / sigma
    }
    const abar = alphaCumprodAt(Math.round(t));
    const eps = x.map((v, i) => (v - Math.sqrt(abar) * x0[i]) / Math.sqrt(1 - abar));
    return velocity ? eps.map((e, i) => Math.sqrt(abar) * e - Math.sqrt(1 - abar) * x0[i]) : eps;
  };
}

describe('previews of the clean sample during the loop', () => {
  // With the exact prediction for one clean sample, the clean sample read off the model's output at
  // every step must be that sample, whatever the scheduler and the prediction type: the noise levels
  // cleanEstimate reads off addNoise must be those of the sample the loop actually holds.
  const cases = [
    ...['PNDMScheduler', 'DDIMScheduler', 'EulerDiscreteScheduler', 'EulerAncestralDiscreteScheduler', 'DPMSolverMultistepScheduler', 'LCMScheduler'].flatMap((className) =>
      (['epsilon', 'v_prediction'] as const).map((prediction) => [className, prediction] as const),
    ),
    ['FlowMatchEulerDiscreteScheduler', 'flow'] as const,
  ];
  for (const [className, prediction] of cases) {
    it(`${className}, ${prediction}: every preview is the clean sample`, async () => {
      const flow = prediction === 'flow';
      const s = createScheduler(flow ? { _class_name: className, num_train_timesteps: 1000, shift: 1 } : { ...SD15, _class_name: className, prediction_type: prediction });
      s.setTimesteps(8);
      const previews: Float32Array[] = [];
      const preview = { prediction, show: async (clean: Float32Array) => void previews.push(clean) };
      const predict = oracle(flow, prediction === 'v_prediction');
      await denoise(s, { latents: s.addNoise(x0, n, 0), call: 0 }, NO_DRAWS, predict, { previewsAt: () => [0] }, preview);
      expect(previews.length).toBe(s.timesteps.length - 1);
      for (const clean of previews) expectClose(clean, (i) => x0[i], 2e-3);
    });
  }
});

describe('denoising from the middle of the schedule', () => {
  // With the exact prediction for one clean sample, a deterministic sampler started at strength's step
  // must land on that sample (DDIM without set_alpha_to_one stops at abar_0, one training step short):
  // wrong noise levels, a warm-up keyed to the wrong call, or a loop that skips or repeats a
  // step would leave it elsewhere.
  const lastLevel = alphaCumprod(0);
  for (const [className, steps, strength, finalAbar] of [
    ['DDIMScheduler', 20, 0.6, lastLevel],
    ['DPMSolverMultistepScheduler', 20, 0.6, 1],
    ['FlowMatchEulerDiscreteScheduler', 8, 0.5, 1],
  ] as const) {
    it(`${className} lands on the clean sample`, async () => {
      const flow = className === 'FlowMatchEulerDiscreteScheduler';
      const s = createScheduler(flow ? { _class_name: className, num_train_timesteps: 1000, shift: 1 } : { ...SD15, _class_name: className });
      s.setTimesteps(steps);
      const start = strengthStart(steps, strength, flow ? 'flow' : 'vp');
      const steps_seen: number[] = [];
      const out = await denoise(s, { latents: s.addNoise(x0, n, start), call: start }, NO_DRAWS, oracle(flow), { onStep: (step, total) => steps_seen.push(step / total) });
      expectClose(out, (i) => Math.sqrt(finalAbar) * x0[i] + Math.sqrt(1 - finalAbar) * n[i], 2e-3);
      expect(steps_seen.at(-1)).toBe(1);
    });
  }
});

describe('inpainting from the middle of the schedule', () => {
  // diffusers' inpainting for UNets without mask inputs: after every step the kept area is put back as
  // the picture noised to the next call's level, so each model call sees it at its own level, the last
  // call included (a kept area put back clean one call early passed every other test); the output keeps it clean.
  it('gives every model call the kept area noised to its level, and returns it clean', async () => {
    const s = createScheduler({ ...SD15, _class_name: 'DDIMScheduler' });
    s.setTimesteps(6);
    const start = strengthStart(6, 0.5, 'vp');
    const mask = Float32Array.from(x0, (_, i) => i % 2);
    const inputs: Float32Array[] = [];
    const predict = async (modelInput: Float32Array, timestep: number) => {
      inputs.push(modelInput.slice());
      return oracle(false)(modelInput, timestep);
    };
    const out = await denoise(s, { latents: s.addNoise(x0, n, start), call: start, keep: { original: x0, noise: n, mask } }, NO_DRAWS, predict);
    expect(inputs).toHaveLength(6 - start);
    inputs.forEach((input, k) => {
      const level = s.addNoise(x0, n, start + k);
      const kept = (values: Float32Array) => values.filter((_, i) => mask[i] === 0);
      expect(kept(input)).toEqual(kept(level));
    });
    expect(out.filter((_, i) => mask[i] === 0)).toEqual(x0.filter((_, i) => mask[i] === 0));
  });
});

/**
 * abar_t of the same betas rescaled to zero terminal SNR (Lin et al. 2023, Algorithm 1), in double:
 * sqrt(abar_t) shifted so that it ends at 0 and scaled so that it starts where it did.
 */
function zeroSnrAlphaCumprod(t: number): number {
  const [first, last] = [Math.sqrt(alphaCumprod(0)), Math.sqrt(alphaCumprod(999))];
  return (((Math.sqrt(alphaCumprod(t)) - last) * first) / (first - last)) ** 2;
}

describe('zero terminal SNR (rescale_betas_zero_snr), from pure noise and from the middle of the schedule', () => {
  // With the exact v prediction for one clean sample on the zero-SNR schedule, every scheduler that
  // takes it lands on that sample and previews it at every step: at strength 1 from timestep 999, pure
  // noise (DDIM's and LCM's abar 0, where x0 = -v; the Euler types' sigma ~4096), as at strength 0.5
  // from the picture noised to the middle. A NaN anywhere would fail the comparison.
  const zeroSnr = { ...SD15, prediction_type: 'v_prediction', timestep_spacing: 'trailing', set_alpha_to_one: true, rescale_betas_zero_snr: true };
  for (const className of ['DDIMScheduler', 'EulerDiscreteScheduler', 'EulerAncestralDiscreteScheduler', 'DPMSolverMultistepScheduler', 'LCMScheduler']) {
    it(`${className} lands on the clean sample`, async () => {
      for (const strength of [1, 0.5]) {
        const s = createScheduler({ ...zeroSnr, _class_name: className });
        s.setTimesteps(8);
        const start = strengthStart(8, strength, 'vp');
        expect(s.timesteps[0]).toBe(999);
        const previews: Float32Array[] = [];
        const preview = { prediction: 'v_prediction' as const, show: async (clean: Float32Array) => void previews.push(clean) };
        const predict = oracle(false, true, zeroSnrAlphaCumprod);
        const out = await denoise(s, { latents: s.addNoise(x0, n, start), call: start }, NO_DRAWS, predict, { previewsAt: () => [0] }, preview);
        expectClose(out, (i) => x0[i], 2e-3);
        expect(previews.length).toBe(s.timesteps.length - start - 1);
        for (const clean of previews) expectClose(clean, (i) => x0[i], 2e-3);
      }
    });
  }
});

describe('PNDM from the middle of the schedule', () => {
  it("runs its warm-up on the first calls made, not on the schedule's first indices, as diffusers' counter does", async () => {
    const s = createScheduler({ ...SD15, _class_name: 'PNDMScheduler' });
    s.setTimesteps(20);
    const start = strengthStart(20, 0.6, 'vp');
    const level = (t: number) => (i: number) => Math.sqrt(alphaCumprod(t)) * x0[i] + Math.sqrt(1 - alphaCumprod(t)) * n[i];
    const predict = oracle(false);
    const t = s.timesteps[start];
    let x = s.addNoise(x0, n, start);
    // The first two calls make one step, t -> t - 50 (the second re-runs it with the mean of both predictions).
    x = s.step(await predict(x, t), start, x, NO_DRAWS);
    expectClose(x, level(t - 50));
    x = s.step(await predict(x, s.timesteps[start + 1]), start + 1, x, NO_DRAWS);
    expectClose(x, level(t - 50));
  });
});

describe('PNDM with its Runge-Kutta warm-up (skip_prk_steps: false) from the middle of the schedule', () => {
  it("steps from the warm-up's timestep of the call towards the timestep of the index, as diffusers' step_prk", () => {
    // 0.6 starts at call 8, among the warm-up's 12 timesteps; 0.3 at call 14, past them (its timestep a
    // multistep one), where the warm-up still runs first, by the counter.
    for (const [strength, expected] of [[0.6, 8], [0.3, 14]] as const) {
      const s = createScheduler({ ...SD15, _class_name: 'PNDMScheduler', skip_prk_steps: false });
      s.setTimesteps(20);
      const start = strengthStart(20, strength, 'vp');
      expect(start).toBe(expected);
      // diffusers: timestep = prk_timesteps[counter // 4 * 4] (the top on the first call), prev_timestep =
      // the timestep handed in minus r // 2 on an even counter; PNDM's transfer (eq. 9) between the two.
      const [from, to] = [s.timesteps[0], s.timesteps[start] - Math.floor(Math.floor(1000 / 20) / 2)];
      const [a, aPrev] = [alphaCumprod(from), alphaCumprod(to)];
      const denominator = a * Math.sqrt(1 - aPrev) + Math.sqrt(a * (1 - a) * aPrev);
      const out = s.step(n, start, x0, NO_DRAWS);
      expectClose(out, (i) => Math.sqrt(aPrev / a) * x0[i] - ((aPrev - a) * n[i]) / denominator);
    }
  });
});
