/**
 * What a model's denoising phase takes for one image of a given size, from what it took at the sizes
 * it ran at. Its activations grow with the pixels and its attention with their square (the tiny SD 1.5
 * export measured 0.13, 1.96 and 8.5 GB at 256², 512² and 768²), so the need of one image is taken
 * to be a·p + b·p² with a, b ≥ 0 for p pixels. A single sample bounds that curve: linearly below its
 * size, quadratically above. Two samples fix it, which extrapolates far closer for a model whose
 * activations are mostly linear; but onnxruntime's arena grows in doubling regions, so what a session
 * holds depends on the sizes it ran before (the same export held 1.2 GB after 256², 384² and 512², and
 * 2.0 GB after 512² alone), and the fitted curve gets a margin of that factor.
 */

/** What one image of `pixels` took. */
export interface MemorySample {
  pixels: number;
  bytes: number;
}

/** Margin on a curve fitted through two samples: the arena's doubling regions (see above). */
const FIT_MARGIN = 2;

/** The bound of one sample: exact for a curve that is all square above its size, all linear below. */
function sampleBound({ pixels, bytes }: MemorySample, at: number): number {
  const ratio = at / pixels;
  return bytes * Math.max(ratio, ratio * ratio);
}

/** a·p + b·p² through two samples, a and b no less than 0. */
function fitThrough(low: MemorySample, high: MemorySample): (at: number) => number {
  const [p1, p2] = [low.pixels, high.pixels];
  let b = (high.bytes / p2 - low.bytes / p1) / (p2 - p1);
  let a = low.bytes / p1 - b * p1;
  if (b < 0) [a, b] = [Math.max(low.bytes / p1, high.bytes / p2), 0];
  else if (a < 0) [a, b] = [0, Math.max(low.bytes / p1 ** 2, high.bytes / p2 ** 2)];
  return (at) => a * at + b * at * at;
}

/** What one image of `pixels` is expected to take (0 without samples). */
export function bytesPerImage(samples: readonly MemorySample[], pixels: number): number {
  if (samples.length === 0) return 0;
  const bound = Math.min(...samples.map((sample) => sampleBound(sample, pixels)));
  const [low, high] = [...samples].sort((x, y) => x.pixels - y.pixels).slice(-2);
  if (!high || pixels <= high.pixels) return bound;
  return Math.min(bound, fitThrough(low, high)(pixels) * FIT_MARGIN);
}

/** Samples with `added`: the larger figure per size, at most `keep` sizes (the largest: the smaller are bounded by them). */
export function mergeSamples(samples: readonly MemorySample[], added: readonly MemorySample[], keep = 16): MemorySample[] {
  const bySize = new Map<number, number>();
  for (const { pixels, bytes } of [...samples, ...added]) bySize.set(pixels, Math.max(bytes, bySize.get(pixels) ?? 0));
  return [...bySize].sort(([a], [b]) => a - b).slice(-keep).map(([pixels, bytes]) => ({ pixels, bytes }));
}
