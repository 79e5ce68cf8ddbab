/**
 * IEEE 754 half precision conversion. onnxruntime-node moves float16 tensors as raw Uint16Array bits,
 * and Node 20 has no Float16Array.
 */

/** One float32 seen as its bits, for toHalfBits. */
const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** A number as the bits of the nearest half (ties to even): overflow is infinity, underflow a signed zero. */
export function toHalfBits(value: number): number {
  f32[0] = value;
  const x = u32[0];
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  let mant = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0); // Inf / NaN
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00; // overflow -> Inf
  if (e <= 0) {
    if (e < -10) return sign; // underflow -> signed zero
    mant |= 0x800000;
    const shift = 14 - e;
    let half = mant >>> shift;
    const rem = mant & ((1 << shift) - 1);
    const mid = 1 << (shift - 1);
    if (rem > mid || (rem === mid && half & 1)) half++;
    return sign | half;
  }
  let half = sign | (e << 10) | (mant >>> 13);
  const rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && half & 1)) half++; // round to nearest even, may carry into exp
  return half;
}

export function fromHalfBits(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >>> 10) & 0x1f;
  const mant = h & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 0x1f) return mant ? NaN : sign * Infinity;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}

export function float32ToHalf(src: ArrayLike<number>): Uint16Array {
  const out = new Uint16Array(src.length);
  for (let i = 0; i < src.length; i++) out[i] = toHalfBits(src[i]);
  return out;
}

/**
 * Every half value as a float32, built on first use (256 KiB): a decode is one load instead of a
 * branchy computation per element, which made reading an SD 1.5 fp16 image's latents and pixels cost
 * ~130 ms of JavaScript. The float32 conversion (toHalfBits) has to round, so it stays computed.
 */
let halfTable: Float32Array | undefined;

export function halfToFloat32(src: Uint16Array): Float32Array {
  if (!halfTable) {
    halfTable = new Float32Array(0x10000);
    for (let h = 0; h < 0x10000; h++) halfTable[h] = fromHalfBits(h);
  }
  const table = halfTable;
  const out = new Float32Array(src.length);
  for (let i = 0; i < src.length; i++) out[i] = table[src[i]];
  return out;
}
