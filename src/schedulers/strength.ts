import { MAX_STEPS } from '../runtime/types.js';
import type { ModelKind } from './scheduler.js';

/**
 * How a pipeline reads image-to-image's `strength`, which diffusers' pipelines do differently: by the
 * kind of model, or 'consistency' for a latent consistency model's own pipeline.
 */
export type StrengthRule = ModelKind | 'consistency';

/**
 * Image-to-image's `strength` as diffusers' pipelines read it: of N steps, the last ones run (their
 * get_timesteps), starting from the input image noised to the first of them (Scheduler.addNoise at
 * that index). How many depends on the pipeline:
 * - 'vp' (the Stable Diffusion pipelines): floor(N x strength), so a low strength of few steps runs none;
 * - 'flow' (FLUX's): N x strength unrounded, starting at int(N - N x strength), so any positive
 *   strength runs at least one step (4 steps at 0.6 run 3, not 2);
 * - 'consistency' (LatentConsistencyModelImg2ImgPipeline): every one of the N steps runs, from the
 *   first, the scheduler having picked them among the less noisy timesteps the strength leaves
 *   (SetTimestepsOptions.strength), which also bounds N.
 * Every scheduler here takes one model call per step from there on (diffusers' `order` 1), PNDM's
 * repeated call included, as diffusers slices its timestep list.
 */
export function strengthStart(steps: number, strength: number, rule: StrengthRule): number {
  if (!(strength > 0 && strength <= 1)) throw new RangeError(`strength must be in (0, 1], got ${strength}`);
  const run = stepsRun(steps, strength, rule);
  if (run < 1) throw new RangeError(`strength ${strength} of ${steps} steps leaves no step to run: raise the strength or the steps`);
  return steps - run;
}

/**
 * The strength a scheduler picks its timesteps by (SetTimestepsOptions.strength): under 'consistency'
 * it is the scheduler's to read; under the other rules the pipeline slices the schedule instead.
 */
export function scheduleStrength(rule: StrengthRule, strength: number | undefined): number | undefined {
  return rule === 'consistency' ? strength : undefined;
}

/** How many of `steps` a strength runs (see strengthStart). Products in double precision, as Python's floats. */
export function stepsRun(steps: number, strength: number, rule: StrengthRule): number {
  if (rule === 'consistency') return steps;
  const share = Math.min(steps * strength, steps);
  return rule === 'flow' ? steps - Math.trunc(Math.max(steps - share, 0)) : Math.floor(share);
}

/**
 * Whether `steps` do what `strength` asks: at least one of them runs, and below strength 1 from the
 * picture noised rather than from noise alone. FLUX's schedule begins at sigma 1, where its start,
 * (1 - sigma) x picture + sigma x noise, holds nothing of the picture; diffusers' int(N - N x strength)
 * starts there whenever N x (1 - strength) < 1 (schnell's 4 steps at 0.8, an edit's default), and the
 * edit would then give the same picture whatever was uploaded (with a mask, the same as at strength 1).
 * An SD schedule's first timestep keeps a trace of the picture, and a strength below 1 never starts there.
 */
export function honoursStrength(steps: number, strength: number, rule: StrengthRule): boolean {
  const run = stepsRun(steps, strength, rule);
  return run >= 1 && (rule !== 'flow' || strength === 1 || run < steps);
}

/** The fewest steps that honour `strength` (in (0, 1]; see honoursStrength), or undefined when more than MAX_STEPS would be needed. */
export function fewestSteps(strength: number, rule: StrengthRule): number | undefined {
  // Counted up rather than worked out from the strength: what decides is stepsRun's rounding, which differs by rule.
  for (let steps = 1; steps <= MAX_STEPS; steps++) if (honoursStrength(steps, strength, rule)) return steps;
  return undefined;
}
