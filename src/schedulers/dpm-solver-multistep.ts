import type { BatchNoise } from '../runtime/random.js';
import type { SchedulerEntry } from './index.js';
import {
  checkPredictionType,
  DDPM_TRAINING_DEFAULTS,
  finalSigma,
  interpolateTable,
  rejectUnsupported,
  roundHalfEven,
  spacedTimesteps,
  timestepsForSigmas,
  trainingSigmas,
  noised,
  vpFromSigma,
  weightedSum,
  withDefaults,
  x0Coefficients,
  type PredictionType,
  type VpCoefficients,
} from './noise-schedule.js';
import type { Scheduler, SchedulerConfig } from './scheduler.js';
import { luSigmas, sigmaSpacingOf, spacedSigmas, type SigmaSpacing } from './sigma-spacing.js';

const CLASS_NAME = 'DPMSolverMultistepScheduler';

const DEFAULTS = {
  ...DDPM_TRAINING_DEFAULTS,
  solver_order: 2,
  prediction_type: 'epsilon',
  algorithm_type: 'dpmsolver++',
  solver_type: 'midpoint',
  lower_order_final: true,
  euler_at_final: false,
  use_karras_sigmas: false,
  use_lu_lambdas: false,
  sigma_min: null as number | null,
  sigma_max: null as number | null,
  final_sigmas_type: 'zero',
  timestep_spacing: 'linspace',
  steps_offset: 0,
  lambda_min_clipped: -Infinity,
};

/**
 * A config with this class's defaults filled in. diffusers takes DEIS's and UniPC's spellings (a config
 * of theirs switched to this class) as its own.
 */
function withOwnDefaults(config: SchedulerConfig): typeof DEFAULTS & SchedulerConfig {
  return withDefaults(DEFAULTS, {
    ...config,
    ...(config.algorithm_type === 'deis' && { algorithm_type: 'dpmsolver++' }),
    ...(['logrho', 'bh1', 'bh2'].includes(String(config.solver_type)) && { solver_type: 'midpoint' }),
  });
}

/** The solver settings of `config` (defaults filled in) that only diffusers runs (SDE and 1S variants, midpoint's alternatives, third order), or undefined. */
function unrunSolver(c: typeof DEFAULTS & SchedulerConfig): string | undefined {
  const unrun = [
    c.algorithm_type !== 'dpmsolver++' && `algorithm_type ${String(c.algorithm_type)}`,
    c.solver_type !== 'midpoint' && `solver_type ${String(c.solver_type)}`,
    c.solver_order > 2 && `solver_order ${c.solver_order}`,
  ].filter((what) => what !== false);
  return unrun.length ? unrun.join(', ') : undefined;
}

/** The variance types whose model outputs a learned variance beside its prediction (DeepFloyd IF's). */
const LEARNED_VARIANCE = ['learned', 'learned_range'];

/** Lower-order steps are more stable when few steps remain; diffusers' threshold. */
const LOWER_ORDER_FINAL_BELOW_STEPS = 15;

/**
 * DPMSolverMultistepScheduler as DPM-Solver++(2M) (Lu et al. 2022): a second-order multistep solver in
 * the data-prediction (x0) form, stepping in lambda = log(alpha / sigma).
 */
export class DPMSolverMultistepScheduler implements Scheduler {
  readonly initNoiseSigma = 1;
  private readonly config: typeof DEFAULTS & SchedulerConfig;
  private readonly predictionType: PredictionType;
  private readonly trainSigmas: Float32Array;
  /**
   * Karras, exponential or beta noise levels, or Lu et al.'s (use_lu_lambdas), in place of the table's at the
   * spaced timesteps.
   */
  private readonly sigmaSpacing: SigmaSpacing | 'lu' | undefined;
  private sigmaSchedule: number[] = [];
  private schedule: number[] = [];
  /** The previous step's x0 prediction, the multistep history (none before the first step). */
  private previousX0: Float32Array | null = null;

  constructor(config: SchedulerConfig = {}) {
    this.config = withOwnDefaults(config);
    const c = this.config;
    rejectUnsupported(CLASS_NAME, c, {
      thresholding: false,
      use_flow_sigmas: false,
    });
    // diffusers reads variance_type only to cut a learned variance off the model's output; any other value
    // (DDPMScheduler's fixed_small, which a config switched from DDPM keeps) runs as none.
    if (LEARNED_VARIANCE.includes(String(c.variance_type))) {
      throw new Error(
        `${CLASS_NAME}: variance_type ${JSON.stringify(c.variance_type)} is not supported: such a model predicts its variance beside the noise, and this server runs models that predict the noise alone`,
      );
    }
    const unrun = unrunSolver(c);
    if (unrun) {
      throw new Error(`${CLASS_NAME}: only algorithm_type dpmsolver++, solver_type midpoint, solver_order 1 or 2 are supported (got ${unrun}); the dpmpp_2m scheduler name selects them`);
    }
    this.predictionType = checkPredictionType(CLASS_NAME, c.prediction_type, ['epsilon', 'v_prediction', 'sample']);
    this.trainSigmas = trainingSigmas(c);
    const spacing = sigmaSpacingOf(CLASS_NAME, c);
    // diffusers checks use_karras_sigmas first, then use_lu_lambdas, then the others, and refuses none of them beside it.
    this.sigmaSpacing = c.use_lu_lambdas && spacing !== 'karras' ? 'lu' : spacing;
  }

  get timesteps(): readonly number[] {
    return this.schedule;
  }

  /** The noise level at each call, then the final one (diffusers' `sigmas`). */
  get sigmas(): readonly number[] {
    return this.sigmaSchedule;
  }

  setTimesteps(numInferenceSteps: number): void {
    const c = this.config;
    const table = this.trainSigmas;
    const T = c.num_train_timesteps;
    // lambda_min_clipped (cosine schedules' -5.1) leaves out the noisiest timesteps, those whose
    // lambda = log(alpha / sigma) = -log(sigma in the table) is below it.
    const end = T - table.filter((sigma) => -Math.log(sigma) < c.lambda_min_clipped).length;
    // linspace and leading space N+1 points and drop the last (t = 0 or steps_offset); trailing does not.
    let timesteps =
      c.timestep_spacing === 'trailing'
        ? spacedTimesteps('trailing', T, numInferenceSteps, c.steps_offset, end)
        : spacedTimesteps(c.timestep_spacing, T, numInferenceSteps + 1, c.steps_offset, end).map(roundHalfEven).slice(0, -1);
    let sigmas: number[];
    if (this.sigmaSpacing) {
      // Spanning the whole training table (timesteps lambda_min_clipped leaves out included), as diffusers does.
      const [highest, lowest] = [table[table.length - 1], table[0]];
      sigmas =
        this.sigmaSpacing === 'lu'
          ? luSigmas(highest, lowest, numInferenceSteps)
          : spacedSigmas(this.sigmaSpacing, c, highest, lowest, numInferenceSteps);
      // Integer timesteps: Karras's and Lu's rounded, except on the cosine schedule; there and for exponential
      // and beta sigmas diffusers leaves them unrounded until they become int64, which truncates (the sigmas
      // stay the spaced ones either way).
      const rounded = (this.sigmaSpacing === 'karras' || this.sigmaSpacing === 'lu') && c.beta_schedule !== 'squaredcos_cap_v2';
      timesteps = timestepsForSigmas(sigmas, table).map(rounded ? roundHalfEven : Math.trunc);
    } else {
      sigmas = timesteps.map((t) => interpolateTable(table, t));
    }
    sigmas.push(finalSigma(c.final_sigmas_type, table));
    this.sigmaSchedule = sigmas;
    this.schedule = timesteps;
    this.previousX0 = null;
  }

  scaleModelInput(sample: Float32Array): Float32Array {
    return sample;
  }

  /** In the VP form this solver steps in: alpha_t x0 + sigma_t noise at call `index`'s sigma. */
  addNoise(original: Float32Array, noise: Float32Array, index: number): Float32Array {
    return noised(original, noise, vpFromSigma(this.sigmaSchedule[index]));
  }

  step(modelOutput: Float32Array, index: number, sample: Float32Array, _noise: BatchNoise): Float32Array {
    const c = this.config;
    const n = this.schedule.length;
    if (n === 0) throw new Error(`${CLASS_NAME}: call setTimesteps before step`);
    const current = vpFromSigma(this.sigmaSchedule[index]);
    const target = vpFromSigma(this.sigmaSchedule[index + 1]);
    const [cSample, cOutput] = x0Coefficients(this.predictionType, current);
    const x0 = weightedSum([
      [cSample, sample],
      [cOutput, modelOutput],
    ]);

    const lowerOrderFinal =
      index === n - 1 &&
      (c.euler_at_final || (c.lower_order_final && n < LOWER_ORDER_FINAL_BELOW_STEPS) || c.final_sigmas_type === 'zero');
    const firstOrder = c.solver_order === 1 || this.previousX0 === null || lowerOrderFinal;

    // At a final sigma of 0, lambda is +inf: exp(-h) = 0 and the step returns x0, as it should.
    const lambda = (vp: VpCoefficients) => Math.log(vp.alpha) - Math.log(vp.sigma);
    const h = lambda(target) - lambda(current);
    const decay = target.alpha * (Math.exp(-h) - 1);
    let next: Float32Array;
    if (firstOrder) {
      // DPM-Solver++ 1 (= DDIM in x0 form): x_t = (sigma_t/sigma_s) x - alpha_t (e^-h - 1) D0.
      next = weightedSum([
        [target.sigma / current.sigma, sample],
        [-decay, x0],
      ]);
    } else {
      // 2M midpoint: D1 = (m0 - m1) / r0 with r0 = h_prev / h, weighted by a further 1/2.
      const previous = vpFromSigma(this.sigmaSchedule[index - 1]);
      const r0 = (lambda(current) - lambda(previous)) / h;
      next = weightedSum([
        [target.sigma / current.sigma, sample],
        [-decay * (1 + 0.5 / r0), x0],
        [decay * (0.5 / r0), this.previousX0!],
      ]);
    }
    this.previousX0 = x0;
    return next;
  }
}

export const dpmSolverMultistep: SchedulerEntry = {
  className: CLASS_NAME,
  kind: 'vp',
  names: {
    dpmpp_2m: { algorithm_type: 'dpmsolver++', solver_order: 2, solver_type: 'midpoint', use_karras_sigmas: false },
    // Karras sigmas in place of any other spacing the model's config asks for, which diffusers would refuse beside them.
    dpmpp_2m_karras: { algorithm_type: 'dpmsolver++', solver_order: 2, solver_type: 'midpoint', use_karras_sigmas: true, use_exponential_sigmas: false, use_beta_sigmas: false },
  },
  create: (config) => new DPMSolverMultistepScheduler(config),
  // DPM-Solver++(2M) on the same sigmas: the nearest this class runs to a model's own SDE or third-order solver.
  unrun(config) {
    const c = withOwnDefaults(config);
    // Two spacings at once are no solver a stand-in could replace: the config is refused, as diffusers refuses it.
    sigmaSpacingOf(CLASS_NAME, c);
    const why = unrunSolver(c);
    return why === undefined ? undefined : { why, by: c.use_karras_sigmas ? 'dpmpp_2m_karras' : 'dpmpp_2m' };
  },
};
