import { ort } from '../src/runtime/onnxruntime.js';
import { OnnxModel } from '../src/runtime/onnx-model.js';
import { TextEncoder } from '../src/pipelines/text-encoder.js';
import { VaeDecoder } from '../src/pipelines/vae.js';

/**
 * Where a generation's time goes inside a worker, measured from outside the pipelines: the benchmark
 * wraps, in its own process only, the methods every family calls (onnxruntime's session run, our
 * OnnxModel.run around it, the text encoder with its tokenizer, the VAE decoder), so the pipelines
 * need no timing hooks. Calls are sequential within a generation, so one "current" context suffices.
 */

/** What onnxruntime's session time of a component is counted as. */
export type Component = 'text encoders' | 'denoiser' | 'VAE decoder' | 'VAE encoder';

export interface StageTotals {
  /** Inside onnxruntime's InferenceSession.run, by component. */
  ort: Record<Component, number>;
  /** OnnxModel.run less the session's run: feed and output conversion (fp16, int64, copies), by component. */
  conversion: Record<Component, number>;
  /** TextEncoder.encode less its model runs: tokenizing and row bookkeeping. */
  tokenize: number;
  /** VaeDecoder.decode less its model runs: latent scaling and the float-to-8-bit conversion. */
  vaeJs: number;
  /** Between one denoiser call's end and the next one's start: the loop's own work per step (scheduler, guidance). */
  denoiserGaps: number[];
}

const zero = (): Record<Component, number> => ({ 'text encoders': 0, denoiser: 0, 'VAE decoder': 0, 'VAE encoder': 0 });

export class StageTimer {
  private totals: StageTotals = StageTimer.empty();
  private readonly components = new Map<string, Component>();
  private current: Component | undefined;
  /** OnnxModel.run time within the text encoder's or decoder's own call. */
  private innerRun = 0;
  /** When the last denoiser call of this generation ended. */
  private denoiserEnd: number | undefined;

  private constructor() {
    this.install();
  }

  private static installed: StageTimer | undefined;

  /** The process's one timer (its wrappers are installed once). */
  static get(): StageTimer {
    return (StageTimer.installed ??= new StageTimer());
  }

  /** `files`: each ONNX file a pipeline loads and what it is (from the model's layout). */
  watch(files: Partial<Record<Component, (string | undefined)[]>>): void {
    for (const [component, list] of Object.entries(files) as [Component, (string | undefined)[]][]) {
      for (const file of list) if (file) this.components.set(file, component);
    }
  }

  private static empty(): StageTotals {
    return { ort: zero(), conversion: zero(), tokenize: 0, vaeJs: 0, denoiserGaps: [] };
  }

  /** The totals since the last reset, and a fresh start. */
  take(): StageTotals {
    const totals = this.totals;
    this.totals = StageTimer.empty();
    this.denoiserEnd = undefined;
    return totals;
  }

  private install(): void {
    const timer = this;
    // onnxruntime types InferenceSession as a factory; at run time it is the class whose instances run.
    const session = (ort.InferenceSession as unknown as { prototype: ort.InferenceSession }).prototype;
    const sessionRun = session.run;
    session.run = async function (this: ort.InferenceSession, ...args: Parameters<typeof sessionRun>) {
      const started = performance.now();
      try {
        return await sessionRun.apply(this, args);
      } finally {
        if (timer.current) timer.totals.ort[timer.current] += performance.now() - started;
      }
    } as typeof sessionRun;

    const modelRun = OnnxModel.prototype.run;
    OnnxModel.prototype.run = async function (this: OnnxModel, ...args: Parameters<typeof modelRun>) {
      const component = timer.components.get(this.file);
      // A model nobody asked to watch (another measurement's) runs untimed.
      if (!component) return modelRun.apply(this, args);
      timer.current = component;
      const ortBefore = timer.totals.ort[component];
      const started = performance.now();
      if (component === 'denoiser' && timer.denoiserEnd !== undefined) timer.totals.denoiserGaps.push(started - timer.denoiserEnd);
      try {
        return await modelRun.apply(this, args);
      } finally {
        const ended = performance.now();
        if (component === 'denoiser') timer.denoiserEnd = ended;
        const wall = ended - started;
        timer.totals.conversion[component] += wall - (timer.totals.ort[component] - ortBefore);
        timer.innerRun += wall;
        timer.current = undefined;
      }
    } as typeof modelRun;

    const wrapOuter = <T extends object, K extends keyof T & string>(proto: T, name: K, add: (ms: number) => void) => {
      const original = proto[name] as (...args: unknown[]) => Promise<unknown>;
      proto[name] = async function (this: T, ...args: unknown[]) {
        const inner = timer.innerRun;
        const started = performance.now();
        try {
          return await original.apply(this, args);
        } finally {
          add(performance.now() - started - (timer.innerRun - inner));
        }
      } as T[K];
    };
    wrapOuter(TextEncoder.prototype, 'encode', (ms) => (timer.totals.tokenize += ms));
    wrapOuter(VaeDecoder.prototype, 'decode', (ms) => (timer.totals.vaeJs += ms));
  }
}
