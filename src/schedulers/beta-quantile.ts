/**
 * The quantile function (inverse CDF) of the Beta(a, b) distribution, which diffusers' beta sigma
 * schedule (use_beta_sigmas, "Beta Sampling is All You Need", Lee et al. 2024) takes from
 * scipy.stats.beta.ppf. Written here rather than taken from npm: the maintained package that has it
 * (@stdlib/stats-base-dists-beta-quantile, as exact) installs 233 packages, 27 MB, for this one function
 * at one shape; these hundred lines match scipy to ~1e-15 (schedulers.test.ts). What it computes:
 *
 * - I_x(a, b), the regularized incomplete beta function (the Beta CDF), from its continued fraction
 *   (DLMF 8.17.22), evaluated by the modified Lentz method; on the side of the mean where that fraction
 *   converges slowly, through the symmetry I_x(a, b) = 1 - I_{1-x}(b, a).
 * - its inverse by Newton's method on I_x(a, b) = p (the derivative is the Beta density), kept inside a
 *   bracket that shrinks every step and bisected whenever Newton would leave it, so it converges for
 *   any a, b > 0 (the U-shaped densities of a, b < 1 included, whose CDF is steep at both ends).
 */

/** Stirling's series for ln Gamma(z) holds to ~1e-15 from here on; smaller z are shifted up to it. */
const STIRLING_FROM = 10;

/**
 * ln Gamma(z) for z > 0: Stirling's asymptotic series, (z - 1/2) ln z - z + ln(2 pi) / 2 + sum of
 * B_2k / (2k (2k - 1) z^(2k-1)), with z first raised past STIRLING_FROM by Gamma(z + 1) = z Gamma(z).
 */
function logGamma(z: number): number {
  let shift = 0;
  while (z < STIRLING_FROM) {
    shift -= Math.log(z);
    z += 1;
  }
  const inverse = 1 / z;
  const inverse2 = inverse * inverse;
  // B_2k / (2k (2k - 1)) for k = 1..5: 1/12, -1/360, 1/1260, -1/1680, 1/1188.
  const series = inverse * (1 / 12 + inverse2 * (-1 / 360 + inverse2 * (1 / 1260 + inverse2 * (-1 / 1680 + inverse2 / 1188))));
  return shift + (z - 0.5) * Math.log(z) - z + 0.5 * Math.log(2 * Math.PI) + series;
}

/** ln B(a, b) = ln Gamma(a) + ln Gamma(b) - ln Gamma(a + b). */
function logBeta(a: number, b: number): number {
  return logGamma(a) + logGamma(b) - logGamma(a + b);
}

/** Where the continued fraction has converged: its last factor is 1 to within a unit in the last place. */
const FRACTION_EPSILON = Number.EPSILON;
/** Lentz's stand-in for a zero denominator. */
const TINY = 1e-300;
const MAX_TERMS = 1000;

/**
 * The continued fraction 1 / (1 + d1 / (1 + d2 / (1 + ...))) of DLMF 8.17.22, with
 * d_(2m+1) = -(a + m)(a + b + m) x / ((a + 2m)(a + 2m + 1)) and d_(2m) = m (b - m) x / ((a + 2m - 1)(a + 2m)).
 */
function incompleteBetaFraction(x: number, a: number, b: number): number {
  const guard = (v: number) => (Math.abs(v) < TINY ? TINY : v);
  let c = 1;
  let d = 1 / guard(1 - ((a + b) * x) / (a + 1));
  let result = d;
  for (let m = 1; m <= MAX_TERMS; m++) {
    const even = (m * (b - m) * x) / ((a + 2 * m - 1) * (a + 2 * m));
    d = 1 / guard(1 + even * d);
    c = guard(1 + even / c);
    result *= d * c;
    const odd = (-(a + m) * (a + b + m) * x) / ((a + 2 * m) * (a + 2 * m + 1));
    d = 1 / guard(1 + odd * d);
    c = guard(1 + odd / c);
    const factor = d * c;
    result *= factor;
    if (Math.abs(factor - 1) <= FRACTION_EPSILON) break;
  }
  return result;
}

/** I_x(a, b), the probability that a Beta(a, b) variable is at most x. */
function regularizedIncompleteBeta(x: number, a: number, b: number): number {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  // x^a (1 - x)^b / B(a, b), in logs so that large a, b do not overflow.
  const front = Math.exp(a * Math.log(x) + b * Math.log1p(-x) - logBeta(a, b));
  // The fraction converges fast below the mean's neighbourhood (a + 1) / (a + b + 2); above it, swap ends.
  if (x < (a + 1) / (a + b + 2)) return (front * incompleteBetaFraction(x, a, b)) / a;
  return 1 - (front * incompleteBetaFraction(1 - x, b, a)) / b;
}

const MAX_ITERATIONS = 300;

/** The x in [0, 1] with I_x(a, b) = p (scipy.stats.beta.ppf(p, a, b)); 0 and 1 for p at or beyond the ends. */
export function betaQuantile(p: number, a: number, b: number): number {
  if (!(a > 0 && b > 0)) throw new Error(`betaQuantile: a and b must be positive (got ${a}, ${b})`);
  if (p <= 0) return 0;
  if (p >= 1) return 1;
  const logNormaliser = logBeta(a, b);
  // Start from the tail's leading term, I_x ~ x^a / (a B(a, b)) near 0 (and the mirror near 1), which is
  // close where the CDF is steepest and Newton alone would be slow to get there.
  const x0 = p < 0.5 ? Math.exp((Math.log(p * a) + logNormaliser) / a) : 1 - Math.exp((Math.log((1 - p) * b) + logNormaliser) / b);
  let [low, high] = [0, 1];
  let x = x0 > 0 && x0 < 1 ? x0 : 0.5;
  for (let i = 0; i < MAX_ITERATIONS; i++) {
    const error = regularizedIncompleteBeta(x, a, b) - p;
    if (error === 0) return x;
    if (error < 0) low = x;
    else high = x;
    const density = Math.exp((a - 1) * Math.log(x) + (b - 1) * Math.log1p(-x) - logNormaliser);
    let next = x - error / density;
    if (!(next > low && next < high)) next = (low + high) / 2;
    // Converged when the step no longer changes x beyond its last bits (relative, so tiny quantiles are exact too).
    const done = Math.abs(next - x) <= 2 * Number.EPSILON * Math.min(next, 1 - next);
    x = next;
    if (done || next === low || next === high) break;
  }
  return x;
}
