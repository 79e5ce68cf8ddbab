import { availableBytes, peakBytes, resetPeak, residentBytes } from '../runtime/memory.js';
import type { GenerationBatch } from '../runtime/types.js';
import type { ModelLayout } from '../models/layout.js';
import { formatBytes } from '../util/bytes.js';
import type { ModelMemory } from '../models/memory-figures.js';
import type { VaeTiler, VaeTiling } from './vae.js';

/**
 * A worker's memory plan: what each model really costs here (measured, not its file sizes: onnxruntime
 * arenas and activations dwarf the weights at large sizes), and a check before each batch that refuses,
 * with a message saying what to change, a batch that would not fit, rather than letting the kernel's
 * OOM killer end the worker.
 */

export class InsufficientMemoryError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'InsufficientMemoryError';
  }
}

/**
 * The VAE decoder's mid-block self-attention over every latent pixel: a tokens x tokens float32 score
 * matrix, its softmax and the product's working copy. It dominates the decode at large sizes and grows
 * with the square of the pixels (measured on the SDXL export: 3.6 GiB at 1024x1024, 9.5 GiB at
 * 1792x1024; this gives 3.0 and 9.2).
 */
export function vaeAttentionBytes(layout: Pick<ModelLayout, 'vae'>, width: number, height: number): number {
  if (!layout.vae.midBlockAttention) return 0;
  const tokens = (width / layout.vae.scaleFactor) * (height / layout.vae.scaleFactor);
  return 3 * tokens * tokens * 4;
}

/** Share of the available memory a batch may plan to use: the server, other workers and the OS move too. */
const HEADROOM = 0.9;

/**
 * Tiles of the VAE decode, in latent pixels: no smaller than this (256 image pixels with the 8x VAE;
 * smaller tiles spend most of each decoder call on overlap), overlapping by a quarter, no less than 8
 * (64 image pixels: test/tiled-vae.test.ts shows no seam at that overlap).
 */
const MIN_TILE = 32;
const MIN_OVERLAP = 8;

/**
 * How to decode an image of this latent size within `budget` bytes: whole (undefined) when its
 * attention fits, else in the largest square tiles (a multiple of 8 latent pixels) whose attention
 * does, never smaller than MIN_TILE.
 */
export function vaeTiling(layout: Pick<ModelLayout, 'vae'>, latentWidth: number, latentHeight: number, budget: number): VaeTiling | undefined {
  const scale = layout.vae.scaleFactor;
  if (vaeAttentionBytes(layout, latentWidth * scale, latentHeight * scale) <= budget) return undefined;
  let tile = Math.floor(Math.max(latentWidth, latentHeight) / 8) * 8;
  while (tile > MIN_TILE && vaeAttentionBytes(layout, tile * scale, tile * scale) > budget) tile -= 8;
  return { tile: Math.max(MIN_TILE, tile), overlap: Math.max(MIN_OVERLAP, Math.floor(tile / 4)) };
}

export class MemoryPlan {
  private readonly figures: Map<string, ModelMemory>;
  /** Model folders whose VAE decoder asked for this plan's tiling (see vaeTiler): their decodes are planned tiled. */
  private readonly tiledDecoders = new Set<string>();

  /** `limit`: the most a batch may plan to take (MEMORY_LIMIT); what the machine has free always bounds it too. */
  constructor(
    known: Record<string, ModelMemory> = {},
    private readonly limit = Infinity,
  ) {
    this.figures = new Map(Object.entries(known));
  }

  /** The figures of a model folder, if it ran here (or in an earlier worker, see EngineSettings.knownMemory). */
  of(modelDir: string): ModelMemory | undefined {
    return this.figures.get(modelDir);
  }

  /** Loads a model, recording how much the worker grew. */
  async measureLoad<T>(modelDir: string, load: () => Promise<T>): Promise<T> {
    const before = residentBytes();
    const loaded = await load();
    const known = this.figures.get(modelDir);
    this.figures.set(modelDir, { peakBytes: 0, peakPixels: 0, ...known, weightsBytes: Math.max(0, residentBytes() - before) });
    return loaded;
  }

  /** The memory a batch may plan to take now. */
  private budget(): number {
    return Math.min(availableBytes(), this.limit) * HEADROOM;
  }

  /**
   * How a model's VAE decoder should decode each image: whole while its attention fits the memory left,
   * else in tiles that do (see vaeTiling). From then on this plan counts that model's decodes as tiled.
   */
  vaeTiler(layout: Pick<ModelLayout, 'dir' | 'vae'>): VaeTiler {
    this.tiledDecoders.add(layout.dir);
    return (latentWidth, latentHeight) => vaeTiling(layout, latentWidth, latentHeight, this.budget());
  }

  /** The decoder's attention as it will run within `budget`: whole, or one tile's when its decoder tiles (see vaeTiler). */
  private decodeAttentionBytes(layout: Pick<ModelLayout, 'dir' | 'vae'>, width: number, height: number, budget: number): number {
    const scale = layout.vae.scaleFactor;
    const tiling = this.tiledDecoders.has(layout.dir) ? vaeTiling(layout, width / scale, height / scale, budget) : undefined;
    return tiling ? vaeAttentionBytes(layout, tiling.tile * scale, tiling.tile * scale) : vaeAttentionBytes(layout, width, height);
  }

  /**
   * What a batch is expected to take above the loaded model: the larger of the VAE's attention (tiled when
   * its decoder tiles within `budget`) and the measured peak scaled by pixels.
   */
  estimate(layout: Pick<ModelLayout, 'dir' | 'vae'>, batch: Pick<GenerationBatch, 'width' | 'height' | 'items'>, budget = this.budget()): number {
    const attention = this.decodeAttentionBytes(layout, batch.width, batch.height, budget);
    const measured = this.figures.get(layout.dir);
    if (!measured?.peakPixels) return attention;
    const pixels = batch.items.length * batch.width * batch.height;
    return Math.max(attention, measured.peakBytes * Math.max(1, pixels / measured.peakPixels));
  }

  /**
   * How many of the batch's images one model call may hold within the memory left: all of them, or
   * fewer (the batch then runs in parts, as its max_batch would have it). Throws InsufficientMemoryError
   * when not even one fits.
   */
  imagesPerRun(layout: Pick<ModelLayout, 'dir' | 'vae'>, batch: Pick<GenerationBatch, 'width' | 'height' | 'items'>, modelName: string): number {
    // Free memory is read once: one decision, one budget (each read is a few /proc and cgroup files).
    const available = Math.min(availableBytes(), this.limit);
    const budget = available * HEADROOM;
    const need = (count: number) => this.estimate(layout, { ...batch, items: batch.items.slice(0, count) }, budget);
    for (let count = batch.items.length; count >= 1; count--) if (need(count) <= budget) return count;
    throw new InsufficientMemoryError(
      `Model '${modelName}' needs about ${formatBytes(need(1))} of memory to make an image of ${batch.width}x${batch.height}` +
        ` and ${formatBytes(available)} is free${this.limit < Infinity ? ` within MEMORY_LIMIT` : ''}. Ask for a smaller size, or free memory: fewer WORKERS (each holds its own models), a lower MODEL_MEMORY_BUDGET, or a higher MEMORY_LIMIT.`,
    );
  }

  /** Runs a batch, recording its peak when it beats the model's last one. */
  async measureRun<T>(modelDir: string, pixels: number, run: () => Promise<T>): Promise<T> {
    const exact = resetPeak();
    const before = residentBytes();
    const result = await run();
    // Without a resettable high-water mark the peak may be an earlier batch's: still an upper bound.
    const peak = Math.max(0, (exact ? peakBytes() : Math.max(peakBytes(), residentBytes())) - before);
    const known = this.figures.get(modelDir) ?? { weightsBytes: 0, peakBytes: 0, peakPixels: 0 };
    if (peak > known.peakBytes) this.figures.set(modelDir, { ...known, peakBytes: peak, peakPixels: pixels });
    return result;
  }
}
