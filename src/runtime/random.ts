import { TorchGenerator } from './torch-generator.js';

/**
 * Seeded Gaussian noise. Every image in a batch owns one generator, so an image is reproduced by its
 * seed alone, whatever batch it ran in.
 */

/** A source of standard normal float32 noise. */
export interface NormalGenerator {
  fillNormal(out: Float32Array): Float32Array;
}

const GOLDEN_GAMMA = 0x9e3779b97f4a7c15n;

/** splitmix64's output function: a bijection on 64 bits that scrambles every input bit. */
function mix64(x: bigint): bigint {
  let z = BigInt.asUintN(64, (x ^ (x >> 30n)) * 0xbf58476d1ce4e5b9n);
  z = BigInt.asUintN(64, (z ^ (z >> 27n)) * 0x94d049bb133111ebn);
  return z ^ (z >> 31n);
}

/** The server's own generator (splitmix64 + Box-Muller): the default, not torch-compatible. */
export class Rng implements NormalGenerator {
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
 * The generators a request may choose (`rng`): `native` is ours; `torch` draws exactly what
 * `torch.Generator("cpu").manual_seed(seed)` does, so seeds reproduce diffusers' pictures.
 */
export const NOISE_GENERATORS = {
  native: (seed: number): NormalGenerator => new Rng(seed),
  torch: (seed: number): NormalGenerator => new TorchGenerator(seed),
} as const;

export type NoiseKind = keyof typeof NOISE_GENERATORS;
export const NOISE_KINDS = Object.keys(NOISE_GENERATORS) as NoiseKind[];

/** What BatchNoise needs of a batch item. */
export interface NoiseSource {
  seed: number;
  rng?: NoiseKind;
  /** Standard-normal starting noise given by the caller (diffusers' `latents=`): used instead of a draw. */
  initialNoise?: Float32Array;
}

/**
 * Noise for a whole batch: element b of the batch draws from its own generator, so the noise of one
 * image does not depend on which other images share its batch.
 */
export class BatchNoise {
  constructor(
    private readonly generators: NormalGenerator[],
    private readonly given: readonly (Float32Array | undefined)[] = [],
  ) {}

  static forItems(items: readonly NoiseSource[]): BatchNoise {
    return new BatchNoise(
      items.map((item) => NOISE_GENERATORS[item.rng ?? 'native'](item.seed)),
      items.map((item) => item.initialNoise),
    );
  }

  get batchSize(): number {
    return this.generators.length;
  }

  /**
   * The starting noise, [batch, perItem]: the caller's where an item has some (the generator then draws
   * nothing, as in diffusers), else drawn.
   */
  initial(perItem: number): Float32Array {
    const out = new Float32Array(perItem * this.generators.length);
    this.generators.forEach((g, b) => {
      const part = out.subarray(b * perItem, (b + 1) * perItem);
      const given = this.given[b];
      if (!given) return g.fillNormal(part);
      if (given.length !== perItem) throw new RangeError(`initial noise of item ${b} has ${given.length} values; this size and model need ${perItem}`);
      part.set(given);
    });
    return out;
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
