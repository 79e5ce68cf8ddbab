/**
 * Image-to-image's `strength` as diffusers' pipelines read it (get_timesteps): of N steps, the last
 * floor(N x strength) run, starting from the input image noised to the first of them (Scheduler.
 * addNoise at that index). Every scheduler here takes one model call per step from there on (diffusers'
 * `order` 1), PNDM's repeated call included, as diffusers slices its timestep list.
 */
export function strengthStart(steps: number, strength: number): number {
  if (!(strength > 0 && strength <= 1)) throw new RangeError(`strength must be in (0, 1], got ${strength}`);
  const run = stepsRun(steps, strength);
  if (run < 1) throw new RangeError(`strength ${strength} of ${steps} steps leaves no step to run: raise the strength or the steps`);
  return steps - run;
}

/** How many of `steps` a strength runs. */
export function stepsRun(steps: number, strength: number): number {
  return Math.min(Math.floor(steps * strength), steps);
}

/** The fewest steps of which `strength` (in (0, 1]) runs at least one. */
export function fewestSteps(strength: number): number {
  let steps = Math.ceil(1 / strength);
  // 1 / strength rounds; the floor in stepsRun must see a whole step.
  while (stepsRun(steps, strength) < 1) steps++;
  return steps;
}
