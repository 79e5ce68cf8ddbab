import { describe, expect, it } from 'vitest';
import { float32ToHalf, fromHalfBits, halfToFloat32, toHalfBits } from '../src/runtime/float16.js';

/** float16 <-> float32 for the fp16 graphs: exact decoding, round-to-nearest-even encoding. */
describe('float16', () => {
  it('decodes every half value to the float32 it stands for', () => {
    const all = Uint16Array.from({ length: 0x10000 }, (_, h) => h);
    const decoded = halfToFloat32(all);
    for (let h = 0; h < 0x10000; h++) expect(Object.is(decoded[h], Math.fround(fromHalfBits(h))) || (Number.isNaN(decoded[h]) && Number.isNaN(fromHalfBits(h)))).toBe(true);
    // Landmarks: 1, -2, the largest finite, the smallest subnormal, infinity.
    expect([...halfToFloat32(Uint16Array.of(0x3c00, 0xc000, 0x7bff, 0x0001, 0x7c00))]).toEqual([1, -2, 65504, 2 ** -24, Infinity]);
  });

  it('encodes to the nearest half, ties to even, and round-trips every half exactly', () => {
    expect(toHalfBits(1 + 2 ** -11)).toBe(0x3c00); // halfway between 1 and the next half: to even
    expect(toHalfBits(1 + 3 * 2 ** -11)).toBe(0x3c02); // halfway, odd below: up
    expect(toHalfBits(70000)).toBe(0x7c00); // beyond the largest: infinity
    // Subnormals (below 2^-14) round as the rest: halfway between two of them, to the even one.
    expect([2 ** -25, 3 * 2 ** -25, 5 * 2 ** -25, -(2 ** -25)].map(toHalfBits)).toEqual([0x0000, 0x0002, 0x0002, 0x8000]);
    expect(toHalfBits(2 ** -25 + 2 ** -40)).toBe(0x0001); // past halfway: up
    const all = Uint16Array.from({ length: 0x7c00 }, (_, h) => h); // every finite non-negative half
    expect(float32ToHalf(halfToFloat32(all))).toEqual(all);
  });

  it('is handed to onnxruntime as Uint16Array bits where Float16Array exists (Node 24+), a view of which its binding reads as 0 bytes', async () => {
    // Node 20 and 22 have no Float16Array: a stand-in makes onnxruntime-common take the same path.
    const stand = Object.getOwnPropertyDescriptor(globalThis, 'Float16Array') ? undefined : class extends Uint16Array {};
    if (stand) Object.defineProperty(globalThis, 'Float16Array', { value: stand, writable: true, configurable: true });
    try {
      const { ort } = await import('../src/runtime/onnxruntime.js');
      expect(new ort.Tensor('float16', float32ToHalf([1, -2]), [2]).data.constructor).toBe(Uint16Array);
    } finally {
      if (stand) Reflect.deleteProperty(globalThis, 'Float16Array');
    }
  });
});
