import { describe, expect, it } from 'vitest';
import { CostModel } from '../src/engine/cost-model.js';
import type { GenerationBatch } from '../src/runtime/types.js';

/** 1 megapixel x 10 steps x 2 images: 20 units of work. */
const batch = (modelDir: string): GenerationBatch => ({
  modelDir,
  width: 1000,
  height: 1000,
  steps: 10,
  guidanceScale: 0,
  items: [
    { prompt: 'a', negativePrompt: '', seed: 1 },
    { prompt: 'b', negativePrompt: '', seed: 2 },
  ],
});

describe('the cost model', () => {
  it("goes by a model's first batch while it runs, then by finished batches only", () => {
    const costs = new CostModel();
    const guess = costs.estimate(batch('a'));
    // A quarter of the first batch took 40 s: a CPU far slower than the guess for a model never timed.
    costs.progress(batch('a'), 40, 0.25);
    expect(costs.estimate(batch('a'))).toBeCloseTo(160);
    expect(costs.estimate(batch('a'))).not.toBeCloseTo(guess);
    // Another model never timed is taken to be as fast as the ones that were.
    expect(costs.estimate(batch('b'))).toBeCloseTo(160);

    // The finished batch replaces the progress figure rather than averaging with it.
    costs.record(batch('a'), 100);
    expect(costs.estimate(batch('a'))).toBeCloseTo(100);
    costs.progress(batch('a'), 1, 0.5);
    expect(costs.estimate(batch('a'))).toBeCloseTo(100);
    // Later batches move the average.
    costs.record(batch('a'), 200);
    expect(costs.estimate(batch('a'))).toBeCloseTo(130);
  });

  it("goes by the steps after a running batch's first: the first also holds the text encoders and first allocations", () => {
    const costs = new CostModel();
    const long = batch('a');
    // The first of 10 steps took 5 s, the next four 1 s each: 5 s and then 1 s a step, not 5 s each.
    costs.progress(long, 5, 0.1);
    expect(costs.estimate(long)).toBeCloseTo(50);
    costs.progress(long, 9, 0.5);
    expect(costs.estimate(long)).toBeCloseTo(5 + 9);
    // Each batch is measured from its own first report.
    const other = batch('a');
    costs.progress(other, 2, 0.1);
    expect(costs.estimate(other)).toBeCloseTo(20);
  });

  it('learns nothing from a batch with no progress yet', () => {
    const costs = new CostModel();
    const guess = costs.estimate(batch('a'));
    costs.progress(batch('a'), 5, 0);
    expect(costs.estimate(batch('a'))).toBe(guess);
  });

  it('keeps what a batch pays once apart from its steps: a one-step batch does not make every step look as slow', () => {
    const costs = new CostModel();
    const small = { ...batch('a'), width: 250, height: 250, steps: 1, items: batch('a').items.slice(0, 1) };
    // 1/16 megapixel, one step, 0.12 s: text encoders, one step, VAE, encoding.
    costs.progress(small, 0.05, 1);
    costs.record(small, 0.12);
    expect(costs.estimate(small)).toBeCloseTo(0.12);
    // A 10-step batch of 2 megapixel-images, timed: 1 s before its first report, then 0.1 s a step, 0.5 s after.
    const big = batch('a');
    for (let step = 1; step <= 10; step++) costs.progress(big, 1 + (step - 1) * 0.1, step / 10);
    costs.record(big, 1 + 0.9 + 0.5);
    // Its steps at 0.05 s per megapixel-image, learned from it alone; what it paid once (0.75 s per
    // megapixel-image) averaged with the small batch's (1.92). The same batch again is estimated at 4 s
    // for its 2.4; one rate per unit of work (1.92 and 0.12, averaged) said 28 s, and 150 steps 414 s.
    const next = batch('a');
    expect(costs.estimate(next)).toBeCloseTo(2 * (0.7 * 1.92 + 0.3 * 0.75 + 9 * 0.05));
    // A batch of more steps costs more by its further steps only.
    expect(costs.estimate({ ...next, steps: 110 })! - costs.estimate(next)).toBeCloseTo(2 * 100 * 0.05);
  });

  it("goes by the denoiser passes an edit's strength leaves of its steps, not by its steps", () => {
    const costs = new CostModel();
    // 10 steps at 1 s each, their 2 megapixel-images: 0.5 s per megapixel-image a step.
    const whole = batch('a');
    for (let step = 1; step <= 10; step++) costs.progress(whole, step, step / 10);
    costs.record(whole, 10);
    // A variation of 10 steps at strength 0.3 runs 3 of them (its steps' 1 s each): 3 s, not 10.
    const variation: GenerationBatch = { ...batch('a'), strength: 0.3, passes: 3 };
    expect(costs.estimate(variation)).toBeCloseTo(3);
    // Timed (its 3 passes, 1 s each), it teaches the same speed: a text-to-image batch stays at 10 s.
    for (let step = 1; step <= 3; step++) costs.progress(variation, step, step / 3);
    costs.record(variation, 3);
    expect(costs.estimate(batch('a'))).toBeCloseTo(10);
  });
});
