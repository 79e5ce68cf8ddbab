/**
 * The noise `torch.Generator("cpu").manual_seed(seed)` gives `torch.randn` in float32, so a seed here
 * makes the same picture as the same seed in diffusers (and A1111's "CPU" RNG). Two parts, both as
 * PyTorch's CPU kernels do them:
 *  - the engine: the 32-bit Mersenne Twister (mt19937) seeded with the low 32 bits of the seed;
 *  - `randn` of a tensor of n >= 16 floats: fill it with uniforms (24-bit mantissas), then turn each
 *    run of 16 into normals with Box-Muller, pairing element j with j + 8; when n is not a multiple of
 *    16, the last 16 elements are drawn again and transformed over (so they overlap the previous run).
 * Every draw of a generation (initial latents, then the ancestral/LCM noise of each step) comes from
 * one generator per image, as diffusers does with a list of generators.
 */

const N = 624;
const M = 397;
const UPPER = 0x80000000;
const LOWER = 0x7fffffff;
const MATRIX_A = 0x9908b0df;
/** torch's normal kernel switches to its Box-Muller-in-runs-of-16 path at this size. */
const RUN = 16;

export class TorchGenerator {
  private readonly state = new Uint32Array(N);
  private next = N;

  constructor(seed: number) {
    this.state[0] = seed >>> 0;
    for (let i = 1; i < N; i++) {
      const prev = this.state[i - 1] ^ (this.state[i - 1] >>> 30);
      // 1812433253 * prev + i, modulo 2^32, without losing bits to float arithmetic.
      this.state[i] = (Math.imul(1812433253, prev) + i) >>> 0;
    }
  }

  /** The next 32-bit output of mt19937. */
  nextUint32(): number {
    if (this.next >= N) this.twist();
    let y = this.state[this.next++];
    y ^= y >>> 11;
    y ^= (y << 7) & 0x9d2c5680;
    y ^= (y << 15) & 0xefc60000;
    y ^= y >>> 18;
    return y >>> 0;
  }

  /** torch's float uniform in [0, 1): the low 24 bits over 2^24. */
  private uniform(): number {
    return (this.nextUint32() & 0xffffff) / 0x1000000;
  }

  /** `torch.randn(out.length, generator=g)` in float32, written into `out`. */
  fillNormal(out: Float32Array): Float32Array {
    const n = out.length;
    if (n < RUN) {
      // torch draws tensors this small with another algorithm (double-precision Box-Muller with a
      // cached spare); no latent tensor is this small, so it is not reproduced here.
      throw new RangeError(`torch-compatible noise needs at least ${RUN} values, got ${n}`);
    }
    for (let i = 0; i < n; i++) out[i] = this.uniform();
    for (let i = 0; i + RUN <= n; i += RUN) boxMuller16(out, i);
    if (n % RUN !== 0) {
      const start = n - RUN;
      for (let i = start; i < n; i++) out[i] = this.uniform();
      boxMuller16(out, start);
    }
    return out;
  }

  private twist(): void {
    const s = this.state;
    for (let i = 0; i < N; i++) {
      const y = (s[i] & UPPER) | (s[(i + 1) % N] & LOWER);
      s[i] = s[(i + M) % N] ^ (y >>> 1) ^ (y & 1 ? MATRIX_A : 0);
    }
    this.next = 0;
  }
}

/** torch's normal_fill_16: uniforms at [start, start + 16) become normals, in float32 arithmetic. */
function boxMuller16(data: Float32Array, start: number): void {
  for (let j = start; j < start + 8; j++) {
    const u1 = Math.fround(1 - data[j]);
    const u2 = data[j + 8];
    const radius = Math.fround(Math.sqrt(Math.fround(-2 * Math.fround(Math.log(u1)))));
    const theta = Math.fround(2 * Math.PI * u2);
    data[j] = radius * Math.fround(Math.cos(theta));
    data[j + 8] = radius * Math.fround(Math.sin(theta));
  }
}
