import { workerData } from 'node:worker_threads';
import { configureEngine, runBatch, type EngineSettings } from '../pipelines/run.js';
import type { GeneratedImage, GenerationBatch } from './types.js';

/** A piscina worker thread: the engine's settings arrive as workerData, batches as tasks. */

interface WorkerData {
  engine: Partial<EngineSettings>;
  cudaDevices: number[];
  workerCounter: Int32Array;
}

const data = workerData as WorkerData;
const workerIndex = Atomics.add(data.workerCounter, 0, 1);
const deviceId = data.cudaDevices[workerIndex % data.cudaDevices.length];
configureEngine({ ...data.engine, runtime: { provider: 'cpu', ...data.engine.runtime, deviceId } });

export interface WorkerTask {
  batch: GenerationBatch;
  /** Shared with the pool: 1 means every client of this batch left, stop at the next step. */
  cancel: Int32Array;
}

export default function generate({ batch, cancel }: WorkerTask): Promise<GeneratedImage[]> {
  return runBatch(batch, { shouldStop: () => Atomics.load(cancel, 0) === 1 });
}
