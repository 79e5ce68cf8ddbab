/**
 * What a model's denoising phase takes for one image of a given size, from what it took at the sizes
 * it ran at. Its activations grow with the pixels and its attention with their square (the tiny SD 1.5
 * export measured 0.13, 1.96 and 8.5 GB at 256², 512² and 768²), so the need of one image is taken
 * to be a·p + b·p² with a, b ≥ 0 for p pixels. A single sample bounds that curve: linearly below its
 * size, quadratically above. But onnxruntime's arena grows in doubling regions, so what a session holds
 * steps up faster than its need and depends on the sizes it ran before (the same export held 1.2 GB
 * after 256², 384² and 512², and 2.0 GB after 512² alone). Beyond the largest size measured, the need
 * is taken as the larger of that sample's quadratic bound and twice the curve fitted through the two
 * largest samples: `npm run bench:memory-plan` measured this 1.0 to 1.9 times what the real exports
 * then took at and beyond their native sizes, where the smaller of the two was 0.57 to 1.19 times.
 */

/** What one image of `pixels` took. */
export interface MemorySample {
  pixels: number;
  bytes: number;
}

/** Margin on a curve fitted through two samples: the arena's doubling regions (see above). */
const ARENA_MARGIN = 2;

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
  return Math.max(bound, fitThrough(low, high)(pixels) * ARENA_MARGIN);
}

/**
 * The least one image of `pixels` needs by the sizes at which an image was seen to need more than
 * their bytes (ModelMemory.exceeded): a larger image needs no less.
 */
export function leastPerImage(exceeded: readonly MemorySample[], pixels: number): number {
  return Math.max(0, ...exceeded.filter((sample) => sample.pixels <= pixels).map((sample) => sample.bytes * EXCEEDED_MARGIN));
}

/** "More than": what an exceeded figure is taken to mean. */
const EXCEEDED_MARGIN = 1.05;

/** Samples with `added`: the larger figure per size, at most `keep` sizes (the largest: the smaller are bounded by them). */
export function mergeSamples(samples: readonly MemorySample[], added: readonly MemorySample[], keep = 16): MemorySample[] {
  const bySize = new Map<number, number>();
  for (const { pixels, bytes } of [...samples, ...added]) bySize.set(pixels, Math.max(bytes, bySize.get(pixels) ?? 0));
  return [...bySize].sort(([a], [b]) => a - b).slice(-keep).map(([pixels, bytes]) => ({ pixels, bytes }));
}
