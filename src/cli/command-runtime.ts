import os from 'node:os';
import type { ModelSettings } from '../config.js';
import { WorkerRuntime } from '../pipelines/run.js';

/**
 * The runtime of a command that runs a model in its own process (generate, models verify), with the
 * settings a server's worker would honour: WORKER_THREADS (default every core: nothing else runs here),
 * MEMORY_LIMIT and GRAPH_REWRITES.
 */
export function commandRuntime(config: ModelSettings): WorkerRuntime {
  return new WorkerRuntime({ runtime: { provider: config.executionProvider, threads: config.workerThreads ?? os.availableParallelism(), graphRewrites: config.graphRewrites }, memoryLimit: config.memoryLimit });
}
