import type { GenerationBatch } from '../runtime/types.js';

/**
 * Estimated seconds of a batch, for the queue's fair order, admission and Retry-After: its work is
 * megapixels x steps x images, and each model's seconds per unit of work is learned from the batches
 * it finished here (a moving average, so a change of load or hardware shows within a few batches).
 * Until a model's first batch finishes, that batch's progress so far stands in (an estimate off by ten
 * times or more would make Retry-After and the queue's admission wrong for as long as the first batch
 * runs, minutes on a CPU); a model with neither is assumed to be as fast as the average of the others.
 */

/** Seconds per megapixel-step-image of a model never timed anywhere: a mid-range GPU's SD figure. */
const INITIAL_SECONDS_PER_WORK = 0.1;
/** Weight of the newest batch in the moving average. */
const SMOOTHING = 0.3;

const batchWork = (batch: Pick<GenerationBatch, 'width' | 'height' | 'steps' | 'items'>): number =>
  ((batch.width * batch.height) / 1e6) * Math.max(1, batch.steps) * batch.items.length;

export class CostModel {
  private readonly secondsPerWork = new Map<string, number>();
  /** From batches still running, for models none has finished on yet (see progress()). */
  private readonly provisional = new Map<string, number>();
  /** Each running batch's first progress report (see progress()). */
  private readonly firstReports = new WeakMap<GenerationBatch, { seconds: number; done: number }>();

  /** Estimated seconds `batch` takes on one worker. */
  estimate(batch: GenerationBatch): number {
    return batchWork(batch) * (this.rateOf(batch.modelDir) ?? this.fallbackRate());
  }

  /**
   * Learns from a batch still running on a worker that had its model loaded, while its model has no
   * finished batch to go by: the share `done` (0..1) of its denoising took `seconds` since it started.
   * From its second report on, the rate is that of the steps after the first report's: the first step
   * also holds the text encoders and the first run's allocations at the batch's size, and extrapolated
   * over a long batch it made a minute of the 10 s left. The work after the last step (the VAE,
   * encoding) is not in it, so this errs short, and gives way to the first finished batch.
   */
  progress(batch: GenerationBatch, seconds: number, done: number): void {
    if (this.secondsPerWork.has(batch.modelDir) || done <= 0 || seconds <= 0) return;
    const first = this.firstReports.get(batch);
    if (!first) this.firstReports.set(batch, { seconds, done });
    const [span, share] = first ? [seconds - first.seconds, done - first.done] : [seconds, done];
    const work = batchWork(batch) * share;
    if (work > 0 && span > 0) this.provisional.set(batch.modelDir, span / work);
  }

  /** Learns from a batch that completed on a worker that had its model loaded already (a load would skew the rate). */
  record(batch: GenerationBatch, seconds: number): void {
    const work = batchWork(batch);
    if (work <= 0 || seconds <= 0) return;
    const rate = seconds / work;
    const known = this.secondsPerWork.get(batch.modelDir);
    this.secondsPerWork.set(batch.modelDir, known === undefined ? rate : (1 - SMOOTHING) * known + SMOOTHING * rate);
    this.provisional.delete(batch.modelDir);
  }

  private rateOf(modelDir: string): number | undefined {
    return this.secondsPerWork.get(modelDir) ?? this.provisional.get(modelDir);
  }

  private fallbackRate(): number {
    const models = new Set([...this.secondsPerWork.keys(), ...this.provisional.keys()]);
    const rates = [...models].map((model) => this.rateOf(model)!);
    return rates.length ? rates.reduce((a, b) => a + b, 0) / rates.length : INITIAL_SECONDS_PER_WORK;
  }
}
