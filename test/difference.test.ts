import { describe, expect, it } from 'vitest';
import { difference, largestDifference } from '../src/util/difference.js';

/** The comparison the numeric tests and models verify rest on: it must not pass what it cannot measure. */
describe('difference', () => {
  it('gives the largest and the mean absolute difference', () => {
    expect(difference([1, 2, 3], [1, 4, 0])).toEqual({ largest: 3, mean: 5 / 3 });
  });

  it('counts a NaN (a broken output) as the largest difference, never as none', () => {
    expect(largestDifference(new Float32Array([NaN, NaN]), [1, 2])).toBeNaN();
    expect(largestDifference([0, NaN, 0], [0, 0, 5])).toBeNaN();
  });

  it('refuses arrays of different lengths rather than comparing what is there', () => {
    expect(() => difference([1, 2, 3], [1, 2])).toThrow(/cannot compare 3 values with 2/);
  });
});
