import os from 'node:os';
import * as ort from 'onnxruntime-node';

/** How this worker runs ONNX sessions. */
export interface RuntimeOptions {
  provider: 'cpu' | 'cuda';
  /** CUDA device for this worker. */
  deviceId?: number;
  /** Intra-op threads per session; workers x threads should not exceed the cores. */
  threads?: number;
  /** Where to say that CUDA could not be used. */
  warn?: (message: string) => void;
}

export const defaultRuntime = (): RuntimeOptions => ({ provider: 'cpu', threads: Math.max(1, os.availableParallelism()) });

/** Once CUDA failed in this worker, later sessions go straight to CPU instead of failing again. */
let cudaBroken: string | undefined;

function sessionOptions(runtime: RuntimeOptions, provider: 'cpu' | 'cuda'): ort.InferenceSession.SessionOptions {
  return {
    executionProviders: provider === 'cuda' ? [{ name: 'cuda', deviceId: runtime.deviceId ?? 0 }] : ['cpu'],
    graphOptimizationLevel: 'all',
    // One request at a time per worker: parallelism comes from intra-op threads and from more workers.
    executionMode: 'sequential',
    intraOpNumThreads: runtime.threads,
    interOpNumThreads: 1,
  };
}

/**
 * Creates a session on the configured provider. onnxruntime-node throws (rather than falling back) when
 * the CUDA provider libraries cannot load, so a CUDA failure is caught, reported once, and the session
 * is made on CPU.
 */
export async function createSession(file: string, runtime: RuntimeOptions): Promise<{ session: ort.InferenceSession; provider: string }> {
  if (runtime.provider === 'cuda' && !cudaBroken) {
    try {
      return { session: await ort.InferenceSession.create(file, sessionOptions(runtime, 'cuda')), provider: 'cuda' };
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
  return { session: await ort.InferenceSession.create(file, sessionOptions(runtime, 'cpu')), provider: 'cpu' };
}
