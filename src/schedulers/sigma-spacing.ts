/**
 * The noise-level spacings a scheduler_config.json may ask for in place of its scheduler's own:
 * diffusers' use_karras_sigmas, use_exponential_sigmas and use_beta_sigmas (its _convert_to_karras,
 * _convert_to_exponential and _convert_to_beta), which Euler, DPM-Solver and flow-matching Euler share.
 * Each gives n noise levels from the highest down to the lowest of the schedule it replaces.
 */
import { betaQuantile } from './beta-quantile.js';
import { linspace } from './noise-schedule.js';
import type { SchedulerConfig } from './scheduler.js';

export type SigmaSpacing = 'karras' | 'exponential' | 'beta';

const FIELDS: Record<SigmaSpacing, string> = { karras: 'use_karras_sigmas', exponential: 'use_exponential_sigmas', beta: 'use_beta_sigmas' };

/** The spacing a config asks for, if any. More than one is refused, as diffusers' constructors refuse it. */
export function sigmaSpacingOf(className: string, config: SchedulerConfig): SigmaSpacing | undefined {
  const asked = (Object.keys(FIELDS) as SigmaSpacing[]).filter((spacing) => Boolean(config[FIELDS[spacing]]));
  if (asked.length > 1) {
    throw new Error(`${className}: ${asked.map((spacing) => FIELDS[spacing]).join(' and ')} are set together, and a schedule takes one of them: set the others to false`);
  }
  return asked[0];
}

/** Karras et al. 2022 (EDM): rho 7, the paper's. */
const KARRAS_RHO = 7;
/** Beta(0.6, 0.6), the paper's and diffusers' choice, which no config field changes. */
const BETA_SHAPE = 0.6;

/**
 * `n` noise levels spaced as `spacing` says, from the config's sigma_max down to its sigma_min, or where
 * it sets none (most do not), from `highest` down to `lowest`: the ends of the schedule it replaces.
 */
export function spacedSigmas(spacing: SigmaSpacing, config: SchedulerConfig, highest: number, lowest: number, n: number): number[] {
  const max = typeof config.sigma_max === 'number' ? config.sigma_max : highest;
  const min = typeof config.sigma_min === 'number' ? config.sigma_min : lowest;
  switch (spacing) {
    case 'karras': {
      // Evenly spaced in sigma^(1/rho).
      const maxInv = max ** (1 / KARRAS_RHO);
      const minInv = min ** (1 / KARRAS_RHO);
      return linspace(0, 1, n).map((ramp) => (maxInv + ramp * (minInv - maxInv)) ** KARRAS_RHO);
    }
    case 'exponential':
      // Evenly spaced in log sigma.
      return linspace(Math.log(max), Math.log(min), n).map(Math.exp);
    case 'beta':
      // The Beta(0.6, 0.6) quantiles of evenly spaced probabilities from 1 down to 0: its U-shaped
      // density puts more steps near both ends, the highest and the lowest noise.
      return linspace(0, 1, n).map((ramp) => min + betaQuantile(1 - ramp, BETA_SHAPE, BETA_SHAPE) * (max - min));
  }
}

/**
 * DPM-Solver's use_lu_lambdas (its _convert_to_lu): `n` noise levels evenly spaced in lambda = -log sigma
 * (Lu et al. 2022's own schedule), from `highest` down to `lowest`, the table's ends whatever sigma_min and
 * sigma_max say. The ends' logs are float32, as diffusers takes them from its float32 log_sigmas, so the
 * first level lands on the table's last timestep rather than a hair below it.
 */
export function luSigmas(highest: number, lowest: number, n: number): number[] {
  const [maxLambda, minLambda] = [Math.fround(Math.log(highest)), Math.fround(Math.log(lowest))];
  return linspace(0, 1, n).map((ramp) => Math.exp(maxLambda + ramp * (minLambda - maxLambda)));
}
