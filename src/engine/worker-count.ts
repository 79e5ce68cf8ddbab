import { figuresFor, type ModelMemory } from '../models/memory-figures.js';
import type { ExecutionProvider } from '../runtime/providers.js';
import type { ModelRef } from '../runtime/types.js';
import { formatBytes } from '../util/bytes.js';
import { plural } from '../util/plural.js';

/**
 * How many worker processes to run when WORKERS is not set. On CUDA one per GPU (CUDA_DEVICES), on WebGPU one. On the
 * CPU one, whose threads take every core: a second worker on the same cores measured no faster
 * (`npm run bench:spinning`: x0.98 to x1.06 on 2 cores) and holds a second copy of every model. Either
 * way no more than the memory the preloaded models measured (weights plus their largest batch; see
 * src/pipelines/memory-plan.ts) lets fit, and at least one.
 */
export function defaultWorkerCount(options: {
  provider: ExecutionProvider;
  cudaDevices: readonly number[];
  preload: readonly ModelRef[];
  measured: Record<string, ModelMemory>;
  availableBytes: number;
  /** WORKER_THREADS, where set: then the CPU worker's threads are those, not every core. */
  threadsPerWorker?: number;
}): { workers: number; reason: string } {
  const wanted = options.provider === 'cuda' ? options.cudaDevices.length : 1;
  const threads = options.threadsPerWorker;
  const base = {
    cuda: `one per CUDA device (${wanted})`,
    webgpu: 'one on the GPU (WebGPU runs on one adapter)',
    cpu: `one on the CPU (${threads === undefined ? 'its threads use every core' : `with the ${plural(threads, 'thread')} WORKER_THREADS gives it`})`,
  }[options.provider];
  const need = Math.max(0, ...options.preload.map(({ dir, version }) => {
    const m = figuresFor(options.measured[dir], version);
    return m ? m.weightsBytes + m.peakBytes : 0;
  }));
  if (need === 0) return { workers: wanted, reason: base };
  const fit = Math.max(1, Math.floor(options.availableBytes / need));
  if (fit >= wanted) return { workers: wanted, reason: base };
  return { workers: fit, reason: `${base}, but the preloaded models measured ${formatBytes(need)} a worker and ${formatBytes(options.availableBytes)} is free` };
}

/** The CUDA device of worker `slot`: worker i runs on device i mod their count (CUDA_DEVICES, which may name a device more than once). */
export const cudaDeviceOf = (slot: number, cudaDevices: readonly number[]): number => cudaDevices[slot % cudaDevices.length];

/** The most of `workers` that run on one CUDA device (see cudaDeviceOf), each holding its own models there. */
export function workersSharingADevice(workers: number, cudaDevices: readonly number[]): number {
  const onDevice = new Map<number, number>();
  for (let slot = 0; slot < workers; slot++) {
    const device = cudaDeviceOf(slot, cudaDevices);
    onDevice.set(device, (onDevice.get(device) ?? 0) + 1);
  }
  return Math.max(1, ...onDevice.values());
}
