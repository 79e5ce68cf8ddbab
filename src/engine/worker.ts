import { workerData } from 'node:worker_threads';
import { configureEngine, runBatch, type EngineSettings } from '../pipelines/run.js';
import type { GeneratedImage, GenerationBatch } from './types.js';

/** A piscina worker thread: the engine's settings arrive as workerData, batches as tasks. */

configureEngine((workerData as { engine?: Partial<EngineSettings> } | undefined)?.engine ?? {});

export default function generate(batch: GenerationBatch): Promise<GeneratedImage[]> {
  return runBatch(batch);
}
