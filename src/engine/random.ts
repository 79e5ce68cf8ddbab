/**
 * Seeded Gaussian noise. Every image in a batch owns one generator, so an image is reproduced by its
 * seed alone, whatever batch it ran in.
 */
const GOLDEN_GAMMA = 0x9e3779b97f4a7c15n;

/** splitmix64's output function: a bijection on 64 bits that scrambles every input bit. */
function mix64(x: bigint): bigint {
  let z = BigInt.asUintN(64, (x ^ (x >> 30n)) * 0xbf58476d1ce4e5b9n);
  z = BigInt.asUintN(64, (z ^ (z >> 27n)) * 0x94d049bb133111ebn);
  return z ^ (z >> 31n);
}

export class Rng {
  private state: bigint;
  private spare: number | null = null;

  constructor(seed: number) {
    // The state walks in steps of the golden gamma, so it must start at a scrambled seed: started at
    // seed * gamma, seed s + 1 would replay seed s's numbers shifted by one draw.
    this.state = mix64(BigInt.asUintN(64, BigInt(seed) * GOLDEN_GAMMA + 0x632be59bd9b4e019n));
  }

  /** Uniform in (0, 1). */
  uniform(): number {
    this.state = BigInt.asUintN(64, this.state + GOLDEN_GAMMA);
    return (Number(mix64(this.state) >> 11n) + 0.5) / 2 ** 53;
  }

  /** Standard normal (Box-Muller, both values used). */
  normal(): number {
    if (this.spare !== null) {
      const s = this.spare;
      this.spare = null;
      return s;
    }
    const r = Math.sqrt(-2 * Math.log(this.uniform()));
    const theta = 2 * Math.PI * this.uniform();
    this.spare = r * Math.sin(theta);
    return r * Math.cos(theta);
  }

  fillNormal(out: Float32Array): Float32Array {
    for (let i = 0; i < out.length; i++) out[i] = this.normal();
    return out;
  }
}

/**
 * Noise for a whole batch: element b of the batch draws from its own generator, so the noise of one
 * image does not depend on which other images share its batch.
 */
export class BatchNoise {
  constructor(private readonly generators: Rng[]) {}

  get batchSize(): number {
    return this.generators.length;
  }

  /** A [batch, perItem] tensor of standard normal noise. */
  randn(perItem: number): Float32Array {
    const out = new Float32Array(perItem * this.generators.length);
    this.generators.forEach((g, b) => g.fillNormal(out.subarray(b * perItem, (b + 1) * perItem)));
    return out;
  }
}

export const MAX_SEED = 2 ** 32 - 1;

export function randomSeed(): number {
  return Math.floor(Math.random() * (MAX_SEED + 1));
}
