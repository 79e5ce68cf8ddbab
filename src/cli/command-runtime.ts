import os from 'node:os';
import path from 'node:path';
import type { ModelSettings } from '../config.js';
import { openKeptFigures } from '../models/memory-figures.js';
import { WorkerRuntime } from '../pipelines/run.js';
import { providerInUse } from '../runtime/providers.js';

/** A command's runtime, and how it keeps what a model measured in it. */
export interface CommandRuntime {
  runtime: WorkerRuntime;
  /** Keeps what `modelDir` measured here with DATA_DIR's figures (written where they grew), as a server's pool keeps its workers'. */
  keepFigures(modelDir: string): void;
}

/**
 * The runtime of a command that runs a model in its own process (generate, models verify), with the
 * settings a server's worker would honour: WORKER_THREADS (default every core: nothing else runs here),
 * MEMORY_LIMIT and GRAPH_REWRITES. It plans with the memory figures a server keeps in DATA_DIR (those of
 * this EXECUTION_PROVIDER and GRAPH_REWRITES) and keeps there what it measures, a calibration as soon as
 * it ends: a model measured once, by a server or a command, is not calibrated again until its files
 * change (its figures carry their version). `say` tells the command's user of a calibration (the
 * command seems to hang meanwhile) and of figures set aside or not written.
 */
export async function commandRuntime(config: ModelSettings, say: (message: string) => void): Promise<CommandRuntime> {
  const figures = await openKeptFigures(
    config.dataDir,
    { provider: config.executionProvider, graphRewrites: config.graphRewrites },
    { info: say, warn: (message) => say(`warning: ${message}`) },
  );
  const keepFigures = (modelDir: string) => {
    const measured = runtime.modelMemory(modelDir);
    if (measured) figures.record(modelDir, measured);
  };
  const options = { provider: config.executionProvider, threads: config.workerThreads ?? os.availableParallelism(), graphRewrites: config.graphRewrites };
  // The CPU's figures where the GPU's provider did not start (see WorkerRuntime.modelMemory): not kept.
  const kept = () => (providerInUse(options) === options.provider ? `kept in ${path.join(config.dataDir, figures.fileName)}, DATA_DIR` : `not kept: these are the CPU's, the ${options.provider} provider did not start`);
  const runtime = new WorkerRuntime(
    {
      runtime: options,
      memoryLimit: config.memoryLimit,
      knownMemory: figures.all(),
    },
    undefined,
    {
      calibrating: (modelDir) =>
        say(`measuring how much memory '${path.basename(modelDir)}' needs: two one-step runs, once per model and machine (${kept()})`),
      calibrated: keepFigures,
    },
  );
  return { runtime, keepFigures };
}
