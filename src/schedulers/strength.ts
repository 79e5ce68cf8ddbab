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

/** The fewest steps of which `strength` (in (0, 1]) runs at least one. */
export function fewestSteps(strength: number, rule: StrengthRule): number {
  let steps = 1;
  // Counted up rather than worked out from 1 / strength: what decides is stepsRun's rounding, which differs by rule.
  while (stepsRun(steps, strength, rule) < 1) steps++;
  return steps;
}
