import type { GenerationBatch } from '../runtime/types.js';

/**
 * Estimated seconds of a batch, for the queue's fair order, admission and Retry-After. A batch takes
 * megapixels x images x (what its first step takes, with what is paid once per image: the text
 * encoders, the VAE, encoding; plus each further step), and each model's two rates are learned from the
 * batches it finished here (moving averages, so a change of load or hardware shows within a few
 * batches). One rate per unit of work would not do: a one-step 256x256 batch, mostly text encoders and
 * VAE, made its model look twenty times slower per step than it is, and the next 150-step batches were
 * refused for work they did not have. Until a model's first batch finishes, that batch's progress so
 * far stands in (an estimate off by ten times or more would make Retry-After and admission wrong for as
 * long as the first batch runs, minutes on a CPU); a model with neither is assumed to be as fast as the
 * average of the others.
 */

/** Seconds per megapixel-step-image of a model never timed anywhere: a mid-range GPU's SD figure. */
const INITIAL_SECONDS_PER_WORK = 0.1;
/** Weight of the newest batch in the moving averages. */
const SMOOTHING = 0.3;

/** A model's speed, in seconds per megapixel-image. */
interface Rates {
  /** The first step, and what is paid once per image (text encoders, VAE, encoding). */
  first: number;
  /** Each step after the first; undefined until a batch of several steps was timed. */
  step?: number;
}

/** Two progress reports of a running batch: seconds since it started, and the share of its steps done. */
interface Reports {
  first: { seconds: number; done: number };
  last: { seconds: number; done: number };
}

const megapixelImages = (batch: Pick<GenerationBatch, 'width' | 'height' | 'items'>): number => ((batch.width * batch.height) / 1e6) * batch.items.length;
/**
 * The model calls of a batch's denoising: an edit's strength runs a share of its steps (a variation's
 * 0.3, a third), and timed by its steps, it made every model look three times faster per step than it is,
 * and its own batches three times dearer.
 */
const stepsOf = (batch: Pick<GenerationBatch, 'steps' | 'passes'>) => Math.max(1, batch.passes ?? batch.steps);
const average = (known: number | undefined, sample: number) => (known === undefined ? sample : (1 - SMOOTHING) * known + SMOOTHING * sample);

export class CostModel {
  private readonly finished = new Map<string, Rates>();
  /** From batches still running, for models none has finished on yet (see progress()). */
  private readonly provisional = new Map<string, Rates>();
  private readonly reports = new WeakMap<GenerationBatch, Reports>();

  /** Estimated seconds `batch` takes on one worker. */
  estimate(batch: GenerationBatch): number {
    const rates = this.ratesOf(batch.modelDir) ?? this.fallback();
    // A model timed only on one-step batches has no rate per step yet: as a step of the others'.
    const step = rates.step ?? this.fallback().step ?? rates.first;
    return megapixelImages(batch) * (rates.first + (stepsOf(batch) - 1) * step);
  }

  /**
   * Hears a batch still running on a worker that had its model loaded: the share `done` (0..1) of its
   * steps took `seconds` since it started. While its model has no finished batch to go by, its rates so
   * far stand in: the first report's time is the first step's (with the text encoders), the time
   * between the first report and the latest the further steps'. The work after the last step (the VAE,
   * encoding) is not in them, so they err short, and give way to the first finished batch.
   */
  progress(batch: GenerationBatch, seconds: number, done: number): void {
    if (done <= 0 || seconds <= 0) return;
    const known = this.reports.get(batch);
    const reports = { first: known?.first ?? { seconds, done }, last: { seconds, done } };
    this.reports.set(batch, reports);
    if (this.finished.has(batch.modelDir)) return;
    const units = megapixelImages(batch);
    const { step } = this.split(batch, reports, seconds);
    // One report so far: its steps taken alike. Two: the first report's time less its further steps is the first step's.
    const first = step === undefined ? seconds / (units * stepsOf(batch) * done) : Math.max(0, reports.first.seconds / units - step * (stepsOf(batch) * reports.first.done - 1));
    this.provisional.set(batch.modelDir, { first, step: step ?? first });
  }

  /** Learns from a batch that completed in `seconds` on a worker that had its model loaded already (a load would skew the rates). */
  record(batch: GenerationBatch, seconds: number): void {
    if (megapixelImages(batch) <= 0 || seconds <= 0) return;
    const known = this.finished.get(batch.modelDir);
    const reports = this.reports.get(batch);
    // Unheard (no step reported): every step taken alike.
    const { first, step } = reports ? this.split(batch, reports, seconds, known?.step) : this.even(batch, seconds);
    this.finished.set(batch.modelDir, { first: average(known?.first, first), step: step === undefined ? known?.step : average(known?.step, step) });
    this.provisional.delete(batch.modelDir);
  }

  /**
   * A batch's rates from its reports and `seconds` in all: further steps from the time between the first
   * report and the last (none when only one came), the first step and once-per-image work from the rest.
   * `knownStep` takes the place of a rate per step the reports cannot give.
   */
  private split(batch: GenerationBatch, { first, last }: Reports, seconds: number, knownStep?: number): Rates {
    const units = megapixelImages(batch);
    const stepsBetween = stepsOf(batch) * (last.done - first.done);
    const step = stepsBetween > 0 ? (last.seconds - first.seconds) / (units * stepsBetween) : undefined;
    const perStep = step ?? knownStep ?? 0;
    return { first: Math.max(0, seconds / units - perStep * (stepsOf(batch) - 1)), step };
  }

  private even(batch: GenerationBatch, seconds: number): Rates {
    const rate = seconds / (megapixelImages(batch) * stepsOf(batch));
    return { first: rate, step: rate };
  }

  private ratesOf(modelDir: string): Rates | undefined {
    return this.finished.get(modelDir) ?? this.provisional.get(modelDir);
  }

  /** The average of the models timed so far, or the initial guess. */
  private fallback(): Rates {
    // A model has provisional rates only until it has finished ones: each model counts once.
    const rates = [...this.finished.values(), ...this.provisional.values()];
    if (rates.length === 0) return { first: INITIAL_SECONDS_PER_WORK, step: INITIAL_SECONDS_PER_WORK };
    const steps = rates.flatMap((r) => (r.step === undefined ? [] : [r.step]));
    const mean = (values: number[]) => values.reduce((a, b) => a + b, 0) / values.length;
    return { first: mean(rates.map((r) => r.first)), step: steps.length ? mean(steps) : undefined };
  }
}
