/**
 * Maths shared by the schedulers: the training noise schedule, timestep spacing, sigma tables and
 * prediction-type conversions, written once so each scheduler file holds only its update rule.
 * Every formula follows huggingface/diffusers `src/diffusers/schedulers/`.
 */
import type { BatchNoise } from '../runtime/random.js';
import type { SchedulerConfig } from './scheduler.js';

// ---------------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------------

/**
 * The training noise schedule that DDIM, PNDM, Euler, Euler-ancestral and DPM-Solver default to in
 * diffusers (DDPM's linear betas); each scheduler's DEFAULTS start from it.
 */
export const DDPM_TRAINING_DEFAULTS = {
  num_train_timesteps: 1000,
  beta_start: 0.0001,
  beta_end: 0.02,
  beta_schedule: 'linear',
  trained_betas: null as number[] | null,
};

/**
 * A scheduler's diffusers constructor defaults overlaid with a scheduler_config.json. JSON configs
 * write `null` for "not set" (trained_betas, sigma_min ...), so null never replaces a default.
 */
export function withDefaults<D extends object>(defaults: D, config: SchedulerConfig): D & SchedulerConfig {
  const merged: Record<string, unknown> = { ...(defaults as Record<string, unknown>) };
  for (const [key, value] of Object.entries(config)) {
    if (value !== null && value !== undefined) merged[key] = value;
  }
  return merged as D & SchedulerConfig;
}

/**
 * Fails loudly on diffusers options we do not implement, so a config that asks for one never runs a
 * different sampler in silence. `offValues` maps each option to the value meaning "not used".
 */
export function rejectUnsupported(className: string, config: SchedulerConfig, offValues: Record<string, unknown>): void {
  for (const [key, off] of Object.entries(offValues)) {
    const value = config[key];
    if (value !== null && value !== undefined && value !== off) {
      throw new Error(`${className}: ${key}=${JSON.stringify(value)} is not supported`);
    }
  }
}

/** Fails on a prediction_type the diffusers class itself would reject. */
export function checkPredictionType(className: string, type: string, supported: readonly PredictionType[]): PredictionType {
  const found = supported.find((t) => t === type);
  if (!found) throw new Error(`${className}: prediction_type "${type}" is not supported (use ${supported.join(', ')})`);
  return found;
}

// ---------------------------------------------------------------------------------------------
// Training noise schedule
// ---------------------------------------------------------------------------------------------

export interface BetaConfig {
  num_train_timesteps: number;
  beta_start: number;
  beta_end: number;
  beta_schedule: string;
  trained_betas?: number[] | null;
  rescale_betas_zero_snr?: boolean;
}

/**
 * torch.linspace in float32. diffusers builds its tables in float32; rounding the same way
 * reproduces its sigma and timestep tables to the digits they are published with.
 */
function linspaceFloat32(start: number, end: number, n: number): Float32Array {
  const out = new Float32Array(n);
  const s = Math.fround(start);
  const e = Math.fround(end);
  const step = Math.fround((e - s) / (n - 1));
  // torch fills the first half forwards from start and the second half backwards from end.
  const halfway = Math.floor(n / 2);
  for (let i = 0; i < n; i++) out[i] = i < halfway ? s + step * i : e - step * (n - 1 - i);
  return out;
}

/** Betas of the cosine schedule are capped below 1 (diffusers' max_beta), where alpha_bar reaches 0. */
const MAX_COSINE_BETA = 0.999;

/** Glide's cosine schedule ("squaredcos_cap_v2"): betas that discretise alpha_bar(t) = cos^2. */
function cosineBetas(n: number): Float32Array {
  const alphaBar = (t: number) => Math.cos(((t + 0.008) / 1.008) * (Math.PI / 2)) ** 2;
  return Float32Array.from({ length: n }, (_, i) => Math.min(1 - alphaBar((i + 1) / n) / alphaBar(i / n), MAX_COSINE_BETA));
}

/**
 * A config's own betas, one per training timestep: the schedules index alpha-bar by timestep, and past
 * the list's end DDIM, PNDM and LCM read none and draw NaN (diffusers fails there).
 */
function trainedBetas(betas: unknown, n: number): Float32Array {
  if (!Array.isArray(betas) || !betas.every((beta) => typeof beta === 'number')) throw new Error('trained_betas must be a list of numbers, one beta per training timestep');
  if (betas.length < n) {
    throw new Error(`trained_betas has ${betas.length} betas, fewer than num_train_timesteps (${n}): give one per training timestep, or set num_train_timesteps to ${betas.length}`);
  }
  return Float32Array.from(betas);
}

/** The betas a config names: its trained_betas, or its beta_schedule between beta_start and beta_end. */
function betaSchedule(config: BetaConfig): Float32Array {
  const { num_train_timesteps: n, beta_start: start, beta_end: end } = config;
  if (config.trained_betas) return trainedBetas(config.trained_betas, n);
  switch (config.beta_schedule) {
    case 'linear':
      return linspaceFloat32(start, end, n);
    case 'scaled_linear': {
      const roots = linspaceFloat32(Math.sqrt(start), Math.sqrt(end), n);
      for (let i = 0; i < n; i++) roots[i] *= roots[i];
      return roots;
    }
    case 'squaredcos_cap_v2':
      return cosineBetas(n);
    default:
      throw new Error(`beta_schedule "${config.beta_schedule}" is not supported (linear, scaled_linear, squaredcos_cap_v2)`);
  }
}

/** abar_t = prod_{s<=t} (1 - beta_s); torch accumulates the product in double and stores float32. */
function alphasCumprod(betas: Float32Array): Float32Array {
  const out = new Float32Array(betas.length);
  let product = 1;
  for (let t = 0; t < betas.length; t++) {
    product *= Math.fround(1 - betas[t]);
    out[t] = product;
  }
  return out;
}

/**
 * Lin et al. 2023 ("Common Diffusion Noise Schedules and Sample Steps are Flawed", Algorithm 1), which
 * diffusers applies under rescale_betas_zero_snr: sqrt(abar_t) shifted so that the last timestep's is 0
 * (pure noise, what sampling starts from, so the model learns to make very dark and bright pictures),
 * and scaled so that the first keeps its value; then back to betas. In float32, as torch does it.
 */
function zeroTerminalSnr(betas: Float32Array): Float32Array {
  const roots = alphasCumprod(betas);
  for (let t = 0; t < roots.length; t++) roots[t] = Math.sqrt(roots[t]);
  const [first, last] = [roots[0], roots[roots.length - 1]];
  const scale = Math.fround(first / Math.fround(first - last));
  const rescaled = new Float32Array(betas.length);
  let previous = 1;
  for (let t = 0; t < roots.length; t++) {
    const root = Math.fround(Math.fround(roots[t] - last) * scale);
    const abar = Math.fround(root * root);
    // beta_t = 1 - abar_t / abar_{t-1}; the first is 1 - abar_0 itself.
    rescaled[t] = 1 - (t === 0 ? abar : Math.fround(abar / previous));
    previous = abar;
  }
  return rescaled;
}

/**
 * abar_t of a config, the table DDPM-family schedulers index by integer timestep. Under
 * rescale_betas_zero_snr its last entry is 0: x_T holds no trace of the image.
 */
export function trainingAlphasCumprod(config: BetaConfig): Float32Array {
  const betas = betaSchedule(config);
  return alphasCumprod(config.rescale_betas_zero_snr ? zeroTerminalSnr(betas) : betas);
}

/**
 * What diffusers' sigma-space schedulers (Euler, Euler ancestral, DPM-Solver) put for the zero-SNR
 * timestep's abar_t instead of 0, whose sigma would be infinite: fp16's smallest subnormal, 2^-24, for
 * a sigma of about 4096. The alpha-space ones (DDIM, LCM) keep the 0.
 */
const ZERO_SNR_ALPHA_CUMPROD = 2 ** -24;

/**
 * The variance-exploding view of a config's schedule: sigma_t = sqrt((1 - abar_t) / abar_t), t ascending,
 * rounded to float32 at each operation as torch computes diffusers' table: which side of a table entry
 * a spaced sigma falls on decides its truncated timestep (timestepsForSigmas).
 */
export function trainingSigmas(config: BetaConfig): Float32Array {
  // Plain loops here and above: every request's plan builds these tables, and typed arrays' from/map/
  // forEach with a callback run several times slower.
  const alphas = trainingAlphasCumprod(config);
  if (config.rescale_betas_zero_snr) alphas[alphas.length - 1] = ZERO_SNR_ALPHA_CUMPROD;
  const sigmas = new Float32Array(alphas.length);
  for (let t = 0; t < alphas.length; t++) sigmas[t] = Math.sqrt(Math.fround(Math.fround(1 - alphas[t]) / alphas[t]));
  return sigmas;
}

// ---------------------------------------------------------------------------------------------
// Timesteps and sigma tables
// ---------------------------------------------------------------------------------------------

/** numpy's round(): halves go to the even neighbour, which changes some trailing/linspace tables. */
export function roundHalfEven(x: number): number {
  const r = Math.round(x);
  return Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** numpy.linspace(start, stop, n) with the endpoint included. */
export function linspace(start: number, stop: number, n: number): number[] {
  if (n === 1) return [start];
  const step = (stop - start) / (n - 1);
  return Array.from({ length: n }, (_, i) => (i === n - 1 ? stop : start + i * step));
}

/**
 * The N inference timesteps, descending, by diffusers' `timestep_spacing` (Table 2 of "Common
 * Diffusion Noise Schedules and Sample Steps are Flawed"). `linspace` values are fractional; the
 * schedulers that index integer timesteps round them. `end` (DPM-Solver's `last_timestep`, below the
 * training steps when its lambda_min_clipped cuts the noisiest off) bounds the spacing; with trailing
 * spacing the steps stay num_train_timesteps / n apart, so fewer than n may fit.
 */
export function spacedTimesteps(spacing: string, numTrainTimesteps: number, n: number, stepsOffset: number, end = numTrainTimesteps): number[] {
  const T = numTrainTimesteps;
  switch (spacing) {
    case 'linspace':
      return linspace(0, end - 1, n).reverse();
    case 'leading': {
      const ratio = Math.floor(end / n);
      return Array.from({ length: n }, (_, i) => (n - 1 - i) * ratio + stepsOffset);
    }
    case 'trailing': {
      const ratio = T / n;
      // numpy's arange(end, 0, -ratio) fills end + i * (its second value - end), not end - i * ratio: the
      // last bit differs, and decides the rounding of exact halves (48 steps: 937.5 - 1e-13 -> 936).
      const second = end - ratio;
      const delta = second - end;
      // Its length, ceil(end / ratio), counts one value too many at some n (61, 103, 121 ...), a last
      // timestep -1 that DDIM would read as the noisiest alpha-bar: at most n are taken instead.
      const count = Math.min(n, Math.ceil(end / ratio - 1e-9));
      return Array.from({ length: count }, (_, i) => roundHalfEven(i === 0 ? end : end + i * delta) - 1);
    }
    default:
      throw new Error(`timestep_spacing "${spacing}" is not supported (linspace, leading, trailing)`);
  }
}

/** numpy.interp of a table indexed by integer timestep, at fractional timesteps. */
export function interpolateTable(table: ArrayLike<number>, t: number): number {
  if (t <= 0) return table[0];
  const last = table.length - 1;
  if (t >= last) return table[last];
  const low = Math.floor(t);
  return table[low] + (table[low + 1] - table[low]) * (t - low);
}

/** The sigma after the last step: 0 lands on x0, `sigma_min` stops at the smallest training sigma. */
export function finalSigma(type: string, trainSigmas: ArrayLike<number>): number {
  if (type === 'zero') return 0;
  if (type === 'sigma_min') return trainSigmas[0];
  throw new Error(`final_sigmas_type "${type}" is not supported (zero, sigma_min)`);
}

/** The fractional training timestep of each sigma (Karras, exponential and beta schedules), given the training sigma table. */
export function timestepsForSigmas(sigmas: readonly number[], trainSigmas: Float32Array): number[] {
  // In float32 as diffusers' log_sigmas: the first sigma of a spaced schedule is the largest table entry,
  // and whether it lands just below it (timestep 998.99..., which DPM-Solver truncates to 998) or on it
  // turns on that rounding.
  const logSigmas = Float32Array.from(trainSigmas, Math.log);
  return sigmas.map((sigma) => sigmaToTimestep(sigma, logSigmas));
}

/**
 * The fractional training timestep whose sigma is `sigma`: linear interpolation in log-sigma between
 * the two neighbouring table entries (k-diffusion's sigma_to_t). `logSigmas` ascends with t.
 */
function sigmaToTimestep(sigma: number, logSigmas: ArrayLike<number>): number {
  const logSigma = Math.log(Math.max(sigma, 1e-10));
  let low = 0;
  for (let i = 0; i < logSigmas.length; i++) if (logSigmas[i] <= logSigma) low = i;
  low = Math.min(low, logSigmas.length - 2);
  const w = Math.min(Math.max((logSigmas[low] - logSigma) / (logSigmas[low] - logSigmas[low + 1]), 0), 1);
  return (1 - w) * low + w * (low + 1);
}

// ---------------------------------------------------------------------------------------------
// Prediction types
// ---------------------------------------------------------------------------------------------

export type PredictionType = 'epsilon' | 'v_prediction' | 'sample';

/** x_t = alpha * x0 + sigma * eps, the variance-preserving parameterisation. */
export interface VpCoefficients {
  alpha: number;
  sigma: number;
}

export function vpFromAlphaCumprod(alphaCumprod: number): VpCoefficients {
  return { alpha: Math.sqrt(alphaCumprod), sigma: Math.sqrt(1 - alphaCumprod) };
}

/** alpha * x0 + sigma * noise: a clean sample taken to a noise level (diffusers' add_noise). */
export function noised(original: Float32Array, noise: Float32Array, { alpha, sigma }: VpCoefficients): Float32Array {
  return weightedSum([
    [alpha, original],
    [sigma, noise],
  ]);
}

/** The VP coefficients of a variance-exploding sigma (x_vp = x_ve / sqrt(sigma^2 + 1)). */
export function vpFromSigma(sigma: number): VpCoefficients {
  const alpha = 1 / Math.sqrt(sigma * sigma + 1);
  return { alpha, sigma: sigma * alpha };
}

/** [cSample, cOutput] with x0 = cSample * x_t + cOutput * modelOutput. */
export function x0Coefficients(type: PredictionType, { alpha, sigma }: VpCoefficients): [number, number] {
  switch (type) {
    case 'epsilon':
      return [1 / alpha, -sigma / alpha];
    case 'v_prediction':
      return [alpha, -sigma];
    case 'sample':
      return [0, 1];
  }
}

/** [cSample, cOutput] with eps = cSample * x_t + cOutput * modelOutput. */
export function epsilonCoefficients(type: PredictionType, { alpha, sigma }: VpCoefficients): [number, number] {
  switch (type) {
    case 'epsilon':
      return [0, 1];
    case 'v_prediction':
      return [sigma, alpha];
    case 'sample':
      return [1 / sigma, -alpha / sigma];
  }
}

/**
 * One Euler step of the probability-flow ODE in sigma space (Karras' "x = x0 + sigma eps" form):
 * x + (x - x0) / sigma * (sigmaTo - sigma). The sample is unscaled, hence the alpha folded into x0.
 */
export function eulerUpdate(
  type: PredictionType,
  modelOutput: Float32Array,
  sample: Float32Array,
  sigma: number,
  sigmaTo: number,
): Float32Array {
  const vp = vpFromSigma(sigma);
  const [cSample, cOutput] = x0Coefficients(type, vp);
  const r = (sigmaTo - sigma) / sigma;
  return weightedSum([
    [1 + r * (1 - cSample * vp.alpha), sample],
    [-r * cOutput, modelOutput],
  ]);
}

// ---------------------------------------------------------------------------------------------
// Tensors (flat Float32Arrays holding the whole batch)
// ---------------------------------------------------------------------------------------------

/** sum_k c_k * x_k, a new array. */
export function weightedSum(terms: ReadonlyArray<readonly [number, Float32Array]>): Float32Array {
  const [[c0, x0], ...rest] = terms;
  const out = new Float32Array(x0.length);
  for (let i = 0; i < out.length; i++) out[i] = c0 * x0[i];
  for (const [c, x] of rest) {
    if (x.length !== out.length) throw new Error(`tensor length mismatch: ${x.length} vs ${out.length}`);
    if (c !== 0) for (let i = 0; i < out.length; i++) out[i] += c * x[i];
  }
  return out;
}

export function clampInPlace(x: Float32Array, range: number): Float32Array {
  for (let i = 0; i < x.length; i++) x[i] = Math.min(Math.max(x[i], -range), range);
  return x;
}

/** Standard normal noise shaped like `like`, each batch item from its own generator. */
export function noiseLike(noise: BatchNoise, like: Float32Array): Float32Array {
  const perItem = like.length / noise.batchSize;
  if (!Number.isInteger(perItem)) throw new Error(`sample of ${like.length} values is not ${noise.batchSize} equal items`);
  return noise.randn(perItem);
}
