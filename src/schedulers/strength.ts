import type { ModelKind } from './scheduler.js';

/**
 * Image-to-image's `strength` as diffusers' pipelines read it (get_timesteps): of N steps, the last
 * ones run, starting from the input image noised to the first of them (Scheduler.addNoise at that
 * index). How many depends on the pipeline, by the kind of model:
 * - 'vp' (the Stable Diffusion pipelines): floor(N x strength), so a low strength of few steps runs none;
 * - 'flow' (FLUX's): N x strength unrounded, starting at int(N - N x strength), so any positive
 *   strength runs at least one step (4 steps at 0.6 run 3, not 2).
 * Every scheduler here takes one model call per step from there on (diffusers' `order` 1), PNDM's
 * repeated call included, as diffusers slices its timestep list.
 */
export function strengthStart(steps: number, strength: number, kind: ModelKind): number {
  if (!(strength > 0 && strength <= 1)) throw new RangeError(`strength must be in (0, 1], got ${strength}`);
  const run = stepsRun(steps, strength, kind);
  if (run < 1) throw new RangeError(`strength ${strength} of ${steps} steps leaves no step to run: raise the strength or the steps`);
  return steps - run;
}

/** How many of `steps` a strength runs (see strengthStart). Products in double precision, as Python's floats. */
export function stepsRun(steps: number, strength: number, kind: ModelKind): number {
  const share = Math.min(steps * strength, steps);
  return kind === 'flow' ? steps - Math.trunc(Math.max(steps - share, 0)) : Math.floor(share);
}

/** The fewest steps of which `strength` (in (0, 1]) runs at least one. */
export function fewestSteps(strength: number, kind: ModelKind): number {
  let steps = 1;
  // Counted up rather than worked out from 1 / strength: what decides is stepsRun's rounding, which differs by kind.
  while (stepsRun(steps, strength, kind) < 1) steps++;
  return steps;
}
