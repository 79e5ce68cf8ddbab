import { readdir, stat } from 'node:fs/promises';
import path from 'node:path';
import { removedOr, type ModelLayout } from '../models/layout.js';
import type { Pipeline } from './pipeline.js';

/**
 * The loaded pipelines of one worker, within a memory budget: a model's weight files on disk are what
 * its sessions hold in memory (or on the GPU), so once the loaded models' files add up to more than
 * the budget the least recently used ones are released. A model loading or in use (see use()) is never
 * released that way, so one model larger than the budget still runs.
 */

interface Entry {
  pipeline: Promise<Pipeline>;
  version: string | undefined;
  /** 0 until loaded: a model still loading is not counted and cannot be evicted. */
  bytes: number;
  /** Runs using it now (see use()): a worker runs one batch at a time, but a runtime in one process may run several. */
  users: number;
  /** Out of the cache (replaced or released) while runs used it: its sessions go as the last of them ends. */
  dropped?: boolean;
}

/**
 * Bytes of the folders holding the model's ONNX graphs and their external weights. The VAE encoder
 * counts as if loaded: it loads on demand at the model's first edit (see on-demand.ts), after which the
 * budget must already have room for it.
 */
export async function weightBytes(layout: ModelLayout): Promise<number> {
  const dirs = new Set([layout.textEncoder, layout.textEncoder2, layout.denoiser, layout.vaeDecoder, layout.vaeEncoder].filter((f): f is string => !!f).map((f) => path.dirname(f)));
  let total = 0;
  for (const dir of dirs) {
    for (const name of await readdir(dir)) total += (await stat(path.join(dir, name))).size;
  }
  return total;
}

/**
 * The weight bytes of a pipeline just loaded. A folder removed (`models remove`) once its sessions were
 * made fails the load as removed, as one removed while it loads does (see loadPipeline), its sessions
 * released: the count's bare ENOENT was a 500 telling the operator nothing, and its entry stayed, its
 * sessions held for the worker's life, every later request for the version answered that error.
 */
async function loadedBytes(pipeline: Pipeline): Promise<number> {
  try {
    return await weightBytes(pipeline.layout);
  } catch (err) {
    await pipeline.release();
    throw await removedOr(pipeline.layout.dir, err);
  }
}

/** Releases an entry's sessions once it has loaded; one that failed to load holds none. */
function releaseSessions(entry: Entry): Promise<void> {
  return entry.pipeline.then((p) => p.release()).catch(() => undefined);
}

export class PipelineCache {
  /** Map order is recency order: the least recently used first. */
  private readonly entries = new Map<string, Entry>();

  constructor(
    private readonly load: (modelDir: string, version?: string) => Promise<Pipeline>,
    private readonly budgetBytes: number,
  ) {}

  /** `version` changes when the folder was replaced in place: the old sessions are released, the new files loaded. */
  get(modelDir: string, version?: string): Promise<Pipeline> {
    const hit = this.entries.get(modelDir);
    if (hit) {
      this.entries.delete(modelDir);
      if (hit.version === version) {
        this.entries.set(modelDir, hit);
        return hit.pipeline;
      }
      void this.drop(modelDir, hit);
    }
    const entry: Entry = { bytes: 0, users: 0, version, pipeline: this.load(modelDir, version) };
    this.entries.set(modelDir, entry);
    entry.pipeline = entry.pipeline
      .then(async (pipeline) => {
        entry.bytes = await loadedBytes(pipeline);
        this.evictBeyondBudget(modelDir);
        return pipeline;
      })
      .catch((err: unknown) => {
        // Only its own entry: a version that replaced it meanwhile (see drop()) stays.
        if (this.entries.get(modelDir) === entry) this.entries.delete(modelDir);
        throw err;
      });
    return entry.pipeline;
  }

  /** Runs `work` with the model's pipeline (loaded as get() loads it), which is not released as idle meanwhile. */
  async use<T>(modelDir: string, version: string | undefined, work: (pipeline: Pipeline) => Promise<T>): Promise<T> {
    const pipeline = this.get(modelDir, version);
    // get() has set the entry by now (loaded or loading): counted from here, it is in use as it loads too.
    const entry = this.entries.get(modelDir)!;
    entry.users++;
    try {
      return await work(await pipeline);
    } finally {
      entry.users--;
      if (entry.dropped && entry.users === 0) await releaseSessions(entry);
    }
  }

  /** Model folders loaded or loading, least recently used first. */
  loadedModels(): string[] {
    return [...this.entries.keys()];
  }

  holds(modelDir: string, version?: string): boolean {
    const entry = this.entries.get(modelDir);
    return entry !== undefined && entry.version === version;
  }

  /**
   * Releases a model's sessions (their arenas with them): now, or, while runs use them, as the last of
   * those ends. The next get() loads it again.
   */
  async release(modelDir: string): Promise<void> {
    const entry = this.entries.get(modelDir);
    if (entry) await this.drop(modelDir, entry);
  }

  /** Takes an entry out of the cache, its sessions released now or by the last run using them (see use()). */
  private async drop(modelDir: string, entry: Entry): Promise<void> {
    this.entries.delete(modelDir);
    if (entry.users > 0) entry.dropped = true;
    else await releaseSessions(entry);
  }

  /**
   * Releases every model but `keep` that has loaded and that no run uses, and resolves with their folders
   * once their sessions are gone (for a load of `keep` that ran out of memory: see WorkerRuntime.withRoom).
   */
  async releaseIdle(keep: string): Promise<string[]> {
    const idle = [...this.entries].filter(([dir, entry]) => isIdle(dir, entry, keep));
    for (const [dir] of idle) this.entries.delete(dir);
    await Promise.all(idle.map(([, entry]) => releaseSessions(entry)));
    return idle.map(([dir]) => dir);
  }

  private evictBeyondBudget(keep: string): void {
    let total = [...this.entries.values()].reduce((sum, e) => sum + e.bytes, 0);
    for (const [dir, entry] of this.entries) {
      if (total <= this.budgetBytes) break;
      if (!isIdle(dir, entry, keep)) continue;
      this.entries.delete(dir);
      total -= entry.bytes;
      void releaseSessions(entry);
    }
  }
}

/** Whether an entry other than `keep` may be released: loaded, and used by no run. */
function isIdle(dir: string, entry: Entry, keep: string): boolean {
  return dir !== keep && entry.bytes > 0 && entry.users === 0;
}
