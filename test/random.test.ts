import { describe, expect, it } from 'vitest';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { BatchNoise, NOISE_GENERATORS, Rng } from '../src/runtime/random.js';
import { TorchGenerator } from '../src/runtime/torch-generator.js';
import { readGolden } from '../src/cli/golden.js';
import { goldenFile, GOLDENS, haveRealExports, REAL_EXPORT_NAMES } from './helpers/real-exports.js';
import { largestDifference } from '../src/util/difference.js';

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

  it('is splitmix64, as it always was: the uniforms equal a BigInt splitmix64 for seeds across 32 bits', () => {
    // The generator works on 32-bit halves for speed; this is the algorithm as it is defined on 64-bit
    // words. A seed must keep giving its picture across versions, so the stream may never change.
    const u64 = (x: bigint) => BigInt.asUintN(64, x);
    const gamma = 0x9e3779b97f4a7c15n;
    const mix = (x: bigint) => {
      let z = u64((x ^ (x >> 30n)) * 0xbf58476d1ce4e5b9n);
      z = u64((z ^ (z >> 27n)) * 0x94d049bb133111ebn);
      return z ^ (z >> 31n);
    };
    for (const seed of [0, 1, 42, 2 ** 31 - 1, 2 ** 31, 3_000_000_000, 2 ** 32 - 1]) {
      let state = mix(u64(BigInt(seed) * gamma + 0x632be59bd9b4e019n));
      const rng = new Rng(seed);
      for (let i = 0; i < 20_000; i++) {
        state = u64(state + gamma);
        const expected = (Number(mix(state) >> 11n) + 0.5) / 2 ** 53;
        const got = rng.uniform();
        if (got !== expected) expect.fail(`seed ${seed}, draw ${i}: ${got} instead of ${expected}`);
      }
    }
    // And the normals of released versions, pinned.
    const first = (seed: number) => {
      const rng = new Rng(seed);
      return [rng.uniform(), rng.uniform(), rng.normal(), rng.normal(), rng.normal()];
    };
    expect(first(0)).toEqual([0.9604102559276009, 0.4860666991679134, -2.547915546277058, 0.06055550488803538, -1.5193901379664019]);
    expect(first(2 ** 32 - 1)).toEqual([0.15517548909980355, 0.7088288990720653, -1.4804692193874383, -1.2372957144225303, 0.07529555784396678]);
  });

  it('fills arrays with the values normal() gives one by one, across fills of odd and even lengths', () => {
    // fillNormal draws Box-Muller pairs; a fill of odd length leaves the pair's second value for the next.
    const rng = new Rng(9);
    const filled = [1, 3, 2, 0, 5, 4].flatMap((n) => [...rng.fillNormal(new Float32Array(n))]);
    expect(filled).toEqual(draws(9, 15).map(Math.fround));
  });

  it("gives each item of a batch its own seed's noise", () => {
    const batch = new BatchNoise([new Rng(3), new Rng(4)]).randn(5);
    expect([...batch.subarray(5)]).toEqual([...new Rng(4).fillNormal(new Float32Array(5))]);
  });
});

describe('torch-compatible noise', () => {
  it("is driven by the standard mt19937 (C++ std::mt19937's published outputs)", () => {
    const g = new TorchGenerator(5489);
    expect(g.nextUint32()).toBe(3499211612);
    for (let i = 2; i < 10000; i++) g.nextUint32();
    expect(g.nextUint32()).toBe(4123659995);
  });

  it('continues one stream across draws, as one torch generator does', () => {
    const one = new TorchGenerator(3).fillNormal(new Float32Array(64));
    const g = new TorchGenerator(3);
    expect([...g.fillNormal(new Float32Array(32)), ...g.fillNormal(new Float32Array(32))]).toEqual([...one]);
  });

  describe.skipIf(!haveRealExports)("equals torch.randn of the goldens' seeds (needs ../shared/data/real-exports)", () => {
    for (const name of REAL_EXPORT_NAMES) {
      it(`${name}: the starting noise of every case`, async () => {
        for (const c of await readGolden(goldenFile(name))) {
          const bytes = await readFile(path.join(GOLDENS, c.latents.file));
          const torch = new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
          const ours = NOISE_GENERATORS.torch(c.seed).fillNormal(new Float32Array(torch.length));
          // torch's vectorised float32 log/sin/cos round their last bits differently from JavaScript's
          // double ones: a few float32 ulps at most (a wrong stream or pairing would be off by ~1).
          expect(largestDifference(ours, torch)).toBeLessThan(4e-6);
        }
      });
    }
  });
});
