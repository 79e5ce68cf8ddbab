/** How far apart two equally long arrays (pixels, latents, outputs) are, element by element. */
export interface Difference {
  /** The largest absolute difference. */
  largest: number;
  /** The mean absolute difference. */
  mean: number;
}

export function difference(a: ArrayLike<number>, b: ArrayLike<number>): Difference {
  let largest = 0;
  let sum = 0;
  for (let i = 0; i < a.length; i++) {
    const d = Math.abs(a[i] - b[i]);
    sum += d;
    if (d > largest) largest = d;
  }
  return { largest, mean: a.length > 0 ? sum / a.length : 0 };
}

export function largestDifference(a: ArrayLike<number>, b: ArrayLike<number>): number {
  return difference(a, b).largest;
}
