/** How far apart two equally long arrays (pixels, latents, outputs) are, element by element. */
export interface Difference {
  /** The largest absolute difference. */
  largest: number;
  /** The mean absolute difference. */
  mean: number;
}

export function difference(a: ArrayLike<number>, b: ArrayLike<number>): Difference {
  if (a.length !== b.length) throw new RangeError(`cannot compare ${a.length} values with ${b.length}`);
  let largest = 0;
  let sum = 0;
  for (let i = 0; i < a.length; i++) {
    const d = Math.abs(a[i] - b[i]);
    sum += d;
    // Written so that a NaN (a broken output) becomes the largest difference rather than being skipped.
    if (d > largest || Number.isNaN(d)) largest = d;
  }
  return { largest, mean: a.length > 0 ? sum / a.length : 0 };
}

export function largestDifference(a: ArrayLike<number>, b: ArrayLike<number>): number {
  return difference(a, b).largest;
}
