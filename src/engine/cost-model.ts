import type { GenerationBatch } from '../runtime/types.js';

/**
 * Estimated seconds of a batch, for the queue's fair order, admission and Retry-After: its work is
 * megapixels x steps x images, and each model's seconds per unit of work is learned from the batches
 * it finished here (a moving average, so a change of load or hardware shows within a few batches). A
 * model not yet timed is assumed to be as fast as the average of those that were.
 */

/** Seconds per megapixel-step-image of a model never timed anywhere: a mid-range GPU's SD figure. */
const INITIAL_SECONDS_PER_WORK = 0.1;
/** Weight of the newest batch in the moving average. */
const SMOOTHING = 0.3;

const batchWork = (batch: Pick<GenerationBatch, 'width' | 'height' | 'steps' | 'items'>): number =>
  ((batch.width * batch.height) / 1e6) * Math.max(1, batch.steps) * batch.items.length;

export class CostModel {
  private readonly secondsPerWork = new Map<string, number>();

  /** Estimated seconds `batch` takes on one worker. */
  estimate(batch: GenerationBatch): number {
    return batchWork(batch) * (this.secondsPerWork.get(batch.modelDir) ?? this.fallbackRate());
  }

  /** Learns from a batch that completed on a worker that had its model loaded already (a load would skew the rate). */
  record(batch: GenerationBatch, seconds: number): void {
    const work = batchWork(batch);
    if (work <= 0 || seconds <= 0) return;
    const rate = seconds / work;
    const known = this.secondsPerWork.get(batch.modelDir);
    this.secondsPerWork.set(batch.modelDir, known === undefined ? rate : (1 - SMOOTHING) * known + SMOOTHING * rate);
  }

  private fallbackRate(): number {
    const rates = [...this.secondsPerWork.values()];
    return rates.length ? rates.reduce((a, b) => a + b, 0) / rates.length : INITIAL_SECONDS_PER_WORK;
  }
}
