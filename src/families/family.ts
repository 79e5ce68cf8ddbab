import type { ModelKind, SchedulerConfig } from '../schedulers/index.js';

/**
 * What a model family registers (src/families/index.ts): how to tell its folders from every other
 * family's, the rules its configs imply (sizes, VAE factors), its variants' presets, which schedulers
 * fit it, what it can do and which pipeline runs it. models/layout.ts reads folders with it; the
 * pipeline itself is built by pipelines/load.ts from the kind named here, so this folder stays below
 * both. docs/adding-a-model-family.md walks through adding one.
 */

/** Step tiers: dall-e's standard|hd, and gpt-image's low (medium and auto count as standard, high as hd). */
export type Quality = 'low' | 'standard' | 'hd';
/**
 * The step tier each quality a request may name picks: medium and auto (gpt-image's default) are
 * standard; high, and GPT Image 2.5's xhigh and max, are hd, the most steps a model's preset has. Here,
 * below both, for the API's requests (api/dialects.ts) and imagegen.json's hints (models/presets.ts).
 */
export const QUALITY_TIERS = { low: 'low', standard: 'standard', medium: 'standard', auto: 'standard', hd: 'hd', high: 'hd', xhigh: 'hd', max: 'hd' } as const satisfies Record<string, Quality>;
export const STYLES = ['vivid', 'natural'] as const;
export type Style = (typeof STYLES)[number];

/** What a family's pipeline can do with a model that has the components it needs. */
export type Capability = 'text-to-image' | 'image-to-image' | 'inpainting' | 'previews';

/** The pipelines pipelines/load.ts can build; a family names one. */
export type PipelineKind = 'stable-diffusion' | 'flux';

/** What a model folder shows before its family is known (gathered by models/layout.ts). */
export interface FolderFacts {
  /** Its sub-folders that hold a `model.onnx` ('unet', 'text_encoder_2', ...). */
  components: ReadonlySet<string>;
  /** The folder its denoiser was found in: the first of the families' `denoiserFolder`s it has. */
  denoiserFolder: string;
  /** `_class_name` of the denoiser's config.json, when it has one (legacy exports have none). */
  denoiserClass?: string;
  /** `_class_name` of model_index.json, when it has one. */
  pipelineClass?: string;
}

/** The configs that tell a family's variants apart. */
export interface VariantClues {
  scheduler: SchedulerConfig;
  /** The denoiser's config.json; empty when it has none. */
  denoiserConfig: Record<string, unknown>;
  modelIndex?: Record<string, unknown>;
}

/** A variant's request defaults; a folder's `imagegen.json` overrides them (models/presets.ts). */
export interface VariantPreset {
  /** Pixel side it was trained at, when the denoiser's config does not say (see FamilyEntry.nativeSize). */
  nativeSize: number;
  steps: Record<Quality, number>;
  guidanceScale: Record<Style, number>;
  /** Largest batch given to one worker. */
  maxBatch: number;
  /**
   * false: the variant runs no guidance at all, neither a classifier-free batch nor a guidance input
   * (FLUX schnell, distilled to run without it), so a request's guidance_scale above 1 would change
   * nothing and is refused rather than ignored. Omitted: it takes guidance.
   */
  takesGuidance?: false;
}

export interface FamilyEntry<Variant extends string = string> {
  /** ModelLayout.family: what `imagegen models list` shows. */
  name: string;
  /** The folder its denoiser lives in ('unet' or 'transformer'), probed in the registry's order. */
  denoiserFolder: string;
  /**
   * Whether a folder is this family's; asked only of folders whose denoiser is in its `denoiserFolder`
   * (recogniseFamily). Exactly one entry may say yes to a folder (test/families.test.ts checks every
   * reference and real export), so look at class names and components that tell it apart.
   */
  recognise(folder: FolderFacts): boolean;
  /** Component folders it needs beyond the ones every family has (their model.onnx), each with why. */
  requires: ReadonlyArray<{ component: string; why: string }>;
  /** Its variant, from the configs. */
  variantOf(clues: VariantClues): Variant;
  variants: Record<Variant, VariantPreset>;
  /**
   * Image sides must be multiples of this, or the denoiser's graph fails; `vaeScale` is image pixels
   * per latent pixel, `denoiserConfig` empty when the export has no config.json.
   */
  sizeMultiple(vaeScale: number, denoiserConfig: Record<string, unknown>): number;
  /** The pixel side it was trained at, when its denoiser's config says; its variant's otherwise. */
  nativeSize(vaeScale: number, denoiserConfig: Record<string, unknown>): number | undefined;
  /** The VAE's latent scaling when its config does not say (legacy exports have no config.json). */
  vae: { scalingFactor: number; shiftFactor: number };
  /**
   * Which schedulers fit it. Its default scheduler is the folder's own scheduler_config.json, as in
   * diffusers (an `imagegen.json` may name another of this kind).
   */
  schedulerKind: ModelKind;
  capabilities: readonly Capability[];
  pipeline: PipelineKind;
  /** The token length its second text encoder was trained at, per variant, when fixed (T5). */
  secondEncoderLength?: Record<Variant, number>;
}

/** Type-checks an entry against its own variant names (variantOf's results, the per-variant tables). */
export const defineFamily = <Variant extends string>(entry: FamilyEntry<Variant>): FamilyEntry => entry;

/** 2^(blocks - 1): how often a stack of blocks halves (or doubles) the grid, when a config lists them. */
export function halvings(blocks: unknown): number | undefined {
  return Array.isArray(blocks) && blocks.length > 0 ? 2 ** (blocks.length - 1) : undefined;
}
