import { describe, expect, it } from 'vitest';
import { BatchNoise, Rng } from '../src/engine/random.js';

const draws = (seed: number, n: number) => {
  const rng = new Rng(seed);
  return Array.from({ length: n }, () => rng.normal());
};

describe('seeded noise', () => {
  it('repeats exactly for the same seed', () => {
    expect(draws(42, 64)).toEqual(draws(42, 64));
  });

  it('gives neighbouring seeds unrelated noise, not the same numbers shifted', () => {
    // Images of one request use seed, seed + 1, ...: a shifted copy would draw the same picture moved.
    const base = new Set(draws(7, 256));
    for (const seed of [8, 9, 10]) expect(draws(seed, 256).filter((v) => base.has(v))).toEqual([]);
  });

  it('looks standard normal', () => {
    const x = draws(1, 20000);
    const mean = x.reduce((a, b) => a + b, 0) / x.length;
    const variance = x.reduce((a, b) => a + (b - mean) ** 2, 0) / x.length;
    expect(Math.abs(mean)).toBeLessThan(0.03);
    expect(Math.abs(variance - 1)).toBeLessThan(0.04);
  });

  it("gives each item of a batch its own seed's noise", () => {
    const batch = new BatchNoise([new Rng(3), new Rng(4)]).randn(5);
    expect([...batch.subarray(5)]).toEqual([...new Rng(4).fillNormal(new Float32Array(5))]);
  });
});
