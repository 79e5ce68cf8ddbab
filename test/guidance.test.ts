import { describe, expect, it } from 'vitest';
import { applyGuidance } from '../src/pipelines/tensor.js';

describe('classifier-free guidance', () => {
  const uncond = [0, 1, 2, 3];
  const cond = [1, 3, 5, 7];
  const output = Float32Array.from([...uncond, ...cond]);

  it('extrapolates from the negative towards the positive prediction', () => {
    expect([...applyGuidance(output, 1, 2)]).toEqual([2, 5, 8, 11]);
  });

  it("rescales the guided prediction's spread back towards the conditional one (guidance_rescale)", () => {
    const std = (x: number[]) => {
      const m = x.reduce((a, b) => a + b, 0) / x.length;
      return Math.sqrt(x.reduce((a, b) => a + (b - m) ** 2, 0) / (x.length - 1));
    };
    const full = [...applyGuidance(output, 1, 2, 1)];
    expect(std(full)).toBeCloseTo(std(cond), 5);
    const half = [...applyGuidance(output, 1, 2, 0.5)];
    half.forEach((v, i) => expect(v).toBeCloseTo(0.5 * full[i] + 0.5 * [2, 5, 8, 11][i], 5));
  });
});
