import os from 'node:os';
import * as ort from 'onnxruntime-node';

/** How this worker runs ONNX sessions. */
export interface RuntimeOptions {
  provider: 'cpu' | 'cuda';
  /** CUDA device for this worker. */
  deviceId?: number;
  /** Intra-op threads per session: by default each worker's share of the cores (see EnginePoolOptions.threadsPerWorker). */
  threads?: number;
  /**
   * Whether idle intra-op (and inter-op) threads spin-wait for their next task instead of sleeping:
   * onnxruntime's default, but on a machine whose cores are all taken (several workers, the server
   * encoding images) the spinning steals the cores the work needs. Default false.
   */
  spinning?: boolean;
  /** Where to say that CUDA could not be used. */
  warn?: (message: string) => void;
}

export const defaultRuntime = (): RuntimeOptions => ({ provider: 'cpu', threads: Math.max(1, os.availableParallelism()) });

/** Once CUDA failed in this worker, later sessions go straight to CPU instead of failing again. */
let cudaBroken: string | undefined;

/** What one component's session needs beyond the worker's runtime. */
export interface SessionTuning {
  /**
   * Keep onnxruntime's CPU memory arena (default true). The arena keeps a session's peak activations
   * allocated after a run, which saves allocations for a graph run many times per image (the denoiser)
   * but pins gigabytes for one run once per image at full resolution: a VAE decoder at 1024x1024
   * held 6.5 GiB after a decode with the arena and 0.6 GiB without it (measured on the SDXL export).
   */
  memoryArena?: boolean;
}

function sessionOptions(runtime: RuntimeOptions, provider: 'cpu' | 'cuda', tuning: SessionTuning): ort.InferenceSession.SessionOptions {
  const spin = runtime.spinning ? '1' : '0';
  return {
    executionProviders: provider === 'cuda' ? [{ name: 'cuda', deviceId: runtime.deviceId ?? 0 }] : ['cpu'],
    graphOptimizationLevel: 'all',
    enableCpuMemArena: tuning.memoryArena ?? true,
    // One request at a time per worker: parallelism comes from intra-op threads and from more workers.
    executionMode: 'sequential',
    intraOpNumThreads: runtime.threads,
    interOpNumThreads: 1,
    // Session config entries; onnxruntime-node joins the nested keys into "session.intra_op.allow_spinning".
    extra: { session: { intra_op: { allow_spinning: spin }, inter_op: { allow_spinning: spin } } },
  };
}

/**
 * Creates a session on the configured provider. onnxruntime-node throws (rather than falling back) when
 * the CUDA provider libraries cannot load, so a CUDA failure is caught, reported once, and the session
 * is made on CPU.
 */
export async function createSession(file: string, runtime: RuntimeOptions, tuning: SessionTuning = {}): Promise<{ session: ort.InferenceSession; provider: string }> {
  if (runtime.provider === 'cuda' && !cudaBroken) {
    try {
      return { session: await ort.InferenceSession.create(file, sessionOptions(runtime, 'cuda', tuning)), provider: 'cuda' };
    } catch (err) {
      const message = (err as Error).message.split('\n')[0];
      // Only a provider that cannot load is a reason to give up on CUDA for good; anything else (a
      // model too large for the card, a corrupt file) is this model's error.
      if (!/failed to load (shared )?library|providers_cuda|providers_shared|libcu|cudnn/i.test(message)) throw err;
      cudaBroken = message;
      (runtime.warn ?? console.warn)(
        `CUDA execution provider unavailable (${cudaBroken}); running on CPU. ` +
          'Install the CUDA provider libraries as the README describes, or set EXECUTION_PROVIDER=cpu.',
      );
    }
  }
  return { session: await ort.InferenceSession.create(file, sessionOptions(runtime, 'cpu', tuning)), provider: 'cpu' };
}
