/**
 * Seeded Gaussian noise. Every image in a batch owns one generator, so an image is reproduced by its
 * seed alone, whatever batch it ran in.
 */
export class Rng {
  private state: bigint;
  private spare: number | null = null;

  constructor(seed: number) {
    // splitmix64 seeding keeps nearby seeds (1, 2, 3, ...) far apart.
    this.state = BigInt.asUintN(64, BigInt(seed) * 0x9e3779b97f4a7c15n + 0x632be59bd9b4e019n);
  }

  /** Uniform in (0, 1). */
  uniform(): number {
    this.state = BigInt.asUintN(64, this.state + 0x9e3779b97f4a7c15n);
    let z = this.state;
    z = BigInt.asUintN(64, (z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n);
    z = BigInt.asUintN(64, (z ^ (z >> 27n)) * 0x94d049bb133111ebn);
    z ^= z >> 31n;
    return (Number(z >> 11n) + 0.5) / 2 ** 53;
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
