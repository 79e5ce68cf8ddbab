import { TorchGenerator } from './torch-generator.js';

/**
 * Seeded Gaussian noise. Every image in a batch owns one generator, so an image is reproduced by its
 * seed alone, whatever batch it ran in.
 */

/** A source of standard normal float32 noise. */
export interface NormalGenerator {
  fillNormal(out: Float32Array): Float32Array;
}

/**
 * splitmix64 on 64-bit words held as two 32-bit halves (hi, lo), kept as signed int32 so that V8 holds
 * them unboxed. BigInt would say it in three lines, but V8 allocates a BigInt for every operation: the
 * noise of one 1024x1024 FLUX image (262,144 normals) took 36 ms that way. The numbers are the same
 * (test/random.test.ts checks them against a BigInt splitmix64).
 */
const GAMMA_HI = 0x9e3779b9 | 0;
const GAMMA_LO = 0x7f4a7c15 | 0;
const MIX1_HI = 0xbf58476d | 0;
const MIX1_LO = 0x1ce4e5b9 | 0;
const MIX2_HI = 0x94d049bb | 0;
const MIX2_LO = 0x133111eb | 0;
const SEED_OFFSET_HI = 0x632be59b | 0;
const SEED_OFFSET_LO = 0xd9b4e019 | 0;
const TWO_32 = 2 ** 32;

/** The high word of the last mul64, mix64 or add64 (a second return value without allocating a pair). */
let high = 0;

/** (ah, al) * (bh, bl) mod 2^64: returns the low word; the high word is left in `high`. */
function mul64(ah: number, al: number, bh: number, bl: number): number {
  // The high word of al * bl, from 16-bit halves (schoolbook: every partial sum stays under 2^32).
  const a0 = al & 0xffff;
  const a1 = al >>> 16;
  const b0 = bl & 0xffff;
  const b1 = bl >>> 16;
  let t = a1 * b0 + ((a0 * b0) >>> 16);
  const carry = t >>> 16;
  t = a0 * b1 + (t & 0xffff);
  high = (a1 * b1 + carry + (t >>> 16) + Math.imul(al, bh) + Math.imul(ah, bl)) | 0;
  return Math.imul(al, bl);
}

/** (ah, al) + (bh, bl) mod 2^64: returns the low word; the high word is left in `high`. */
function add64(ah: number, al: number, bh: number, bl: number): number {
  const lo = (al >>> 0) + (bl >>> 0);
  high = (ah + bh + (lo >= TWO_32 ? 1 : 0)) | 0;
  return lo | 0;
}

/** splitmix64's output function: a bijection on 64 bits that scrambles every input bit. Low word returned, high in `high`. */
function mix64(hi: number, lo: number): number {
  // z = (x ^ (x >> 30)) * MIX1
  lo = mul64(hi ^ (hi >>> 30), lo ^ ((lo >>> 30) | (hi << 2)), MIX1_HI, MIX1_LO);
  hi = high;
  // z = (z ^ (z >> 27)) * MIX2
  lo = mul64(hi ^ (hi >>> 27), lo ^ ((lo >>> 27) | (hi << 5)), MIX2_HI, MIX2_LO);
  hi = high;
  // z ^ (z >> 31)
  high = hi ^ (hi >>> 31);
  return lo ^ ((lo >>> 31) | (hi << 1));
}

/** The server's own generator (splitmix64 + Box-Muller): the default, not torch-compatible. */
export class Rng implements NormalGenerator {
  private hi: number;
  private lo: number;
  /** The second value of the last Box-Muller pair, not drawn yet (NaN: none). */
  private spare = NaN;

  constructor(seed: number) {
    // The state walks in steps of the golden gamma, so it must start at a scrambled seed: started at
    // seed * gamma, seed s + 1 would replay seed s's numbers shifted by one draw.
    let lo = mul64(0, seed | 0, GAMMA_HI, GAMMA_LO);
    lo = add64(high, lo, SEED_OFFSET_HI, SEED_OFFSET_LO);
    this.lo = mix64(high, lo);
    this.hi = high;
  }

  /** Uniform in (0, 1): the top 53 bits of the next output, centred in their interval. */
  uniform(): number {
    this.lo = add64(this.hi, this.lo, GAMMA_HI, GAMMA_LO);
    this.hi = high;
    const lo = mix64(this.hi, this.lo);
    return ((high >>> 0) * 2 ** 21 + (lo >>> 11) + 0.5) / 2 ** 53;
  }

  /** Standard normal (Box-Muller, both values used: the second is kept for the next draw). */
  normal(): number {
    if (!Number.isNaN(this.spare)) {
      const s = this.spare;
      this.spare = NaN;
      return s;
    }
    const r = Math.sqrt(-2 * Math.log(this.uniform()));
    const theta = 2 * Math.PI * this.uniform();
    this.spare = r * Math.sin(theta);
    return r * Math.cos(theta);
  }

  /** The values normal() would give one after another, drawn a Box-Muller pair at a time (no spare to check per value). */
  fillNormal(out: Float32Array): Float32Array {
    let i = 0;
    if (out.length > 0 && !Number.isNaN(this.spare)) out[i++] = this.normal();
    for (; i + 1 < out.length; i += 2) {
      const r = Math.sqrt(-2 * Math.log(this.uniform()));
      const theta = 2 * Math.PI * this.uniform();
      out[i] = r * Math.cos(theta);
      out[i + 1] = r * Math.sin(theta);
    }
    if (i < out.length) out[i] = this.normal();
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

  /**
   * A [batch, perItem] tensor of standard normal noise. With `drawing`, only the items it marks draw;
   * the others' rows stay zero and their generators untouched (a step one item of the batch takes
   * and another does not: items merged from different requests may differ in what they draw).
   */
  randn(perItem: number, drawing?: readonly boolean[]): Float32Array {
    const out = new Float32Array(perItem * this.generators.length);
    this.generators.forEach((g, b) => {
      if (!drawing || drawing[b]) g.fillNormal(out.subarray(b * perItem, (b + 1) * perItem));
    });
    return out;
  }
}

export const MAX_SEED = 2 ** 32 - 1;

export function randomSeed(): number {
  return Math.floor(Math.random() * (MAX_SEED + 1));
}
