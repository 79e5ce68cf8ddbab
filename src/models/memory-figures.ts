import { mkdir, rename, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { z } from 'zod';
import { readJsonIfPresent } from '../util/files.js';

/**
 * What each model measured in the workers (see src/pipelines/memory-plan.ts), kept in DATA_DIR so a
 * restarted server plans its first batches with them and `imagegen models list` can show them.
 * Keyed by model folder; a file that cannot be read is ignored (the figures are measured again).
 */

const modelMemory = z.object({
  weightsBytes: z.number().nonnegative(),
  peakBytes: z.number().nonnegative(),
  peakPixels: z.number().nonnegative(),
});

/**
 * `weightsBytes`, a worker's resident growth when the model loaded; `peakBytes`, the most a batch took
 * above the loaded model (activations, arena growth); `peakPixels`, images x pixels of that batch.
 */
export type ModelMemory = z.infer<typeof modelMemory>;

const FILE = 'model-memory.json';

function memoryFiguresFile(dataDir: string): string {
  return path.join(dataDir, FILE);
}

export async function readMemoryFigures(dataDir: string): Promise<Record<string, ModelMemory>> {
  try {
    const parsed = z.record(z.string(), modelMemory).safeParse((await readJsonIfPresent(memoryFiguresFile(dataDir))) ?? {});
    return parsed.success ? parsed.data : {};
  } catch {
    return {};
  }
}

/** The figures of one server: the most each model ever took, written through to DATA_DIR. */
export class MemoryFigures {
  private writing = Promise.resolve();

  private constructor(
    private readonly dataDir: string,
    private readonly figures: Record<string, ModelMemory>,
  ) {}

  static async open(dataDir: string): Promise<MemoryFigures> {
    return new MemoryFigures(dataDir, await readMemoryFigures(dataDir));
  }

  all(): Record<string, ModelMemory> {
    return { ...this.figures };
  }

  /** Keeps the larger of the known and the reported figures; writes the file when they grew. */
  record(modelDir: string, reported: ModelMemory): void {
    const known = this.figures[modelDir];
    const peak = known && known.peakBytes >= reported.peakBytes ? known : reported;
    const next = { weightsBytes: Math.max(known?.weightsBytes ?? 0, reported.weightsBytes), peakBytes: peak.peakBytes, peakPixels: peak.peakPixels };
    if (known && next.weightsBytes === known.weightsBytes && next.peakBytes === known.peakBytes) return;
    this.figures[modelDir] = next;
    this.writing = this.writing.then(() => this.write()).catch(() => undefined);
  }

  /** Waits for the last write (tests, shutdown). */
  flushed(): Promise<void> {
    return this.writing;
  }

  /** Written aside and renamed, so a crash never leaves half a file. */
  private async write(): Promise<void> {
    const file = memoryFiguresFile(this.dataDir);
    await mkdir(this.dataDir, { recursive: true });
    await writeFile(`${file}.tmp`, JSON.stringify(this.figures, null, 1));
    await rename(`${file}.tmp`, file);
  }
}
