import { mkdir, rename, unlink, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { isDeepStrictEqual } from 'node:util';
import { z } from 'zod';
import type { ExecutionProvider, GraphRewrites } from '../runtime/providers.js';
import { deleteStaleFiles, isDiskFull, readJsonIfPresent } from '../util/files.js';
import { codeOrMessage } from '../util/error-message.js';
import { mergeSamples, type MemorySample } from './memory-curve.js';

/**
 * What each model measured in the workers (see src/pipelines/memory-plan.ts), kept in DATA_DIR so a
 * restarted server plans its first batches with them and `imagegen models list` can show them.
 * Keyed by model folder; a file that cannot be read, or of an older version, is ignored (the figures
 * are measured again).
 */

const size = z.number().nonnegative();
const sample = z.object({ pixels: size, bytes: size });

const modelMemory = z.object({
  weightsBytes: size,
  peakBytes: size,
  peakPixels: size,
  /**
   * What the text encoders and the denoising loop took per sample of a denoiser call (an image, and its
   * unconditional copy with classifier-free guidance: see Pipeline.samplesPerImage), at each image size
   * it ran at (see memory-curve.ts).
   */
  denoise: z.array(sample).optional(),
  /**
   * The VAE decoder call (an image, or a tile of one) that took the most, its pixels, and the attention
   * it held (counted apart, as it grows with the square of the pixels; see memory-plan.ts).
   */
  decode: sample.extend({ attentionBytes: size }).optional(),
  /**
   * Sizes at which one sample needed more than `bytes`: a run onnxruntime could not allocate, or whose
   * worker the OOM killer ended, though it was planned within them (a limit the plan cannot see, such
   * as the GPU's, or memory taken meanwhile). The plan expects at least that much from then on, at that
   * size and above, and tries again only with more to give. Kept for the server's lifetime, not in
   * DATA_DIR: a restart (after freeing memory, or on a bigger GPU) starts afresh.
   */
  exceeded: z.array(sample).optional(),
  /**
   * The version of the model folder's files they were measured with (ModelEntry.version): a folder
   * replaced under the same id (`models import --force`, `pull --force`, or by hand) holds another
   * model, whose figures these are not. Absent in files written before it was kept: adopted by the
   * next version measured.
   */
  version: z.string().optional(),
});

/**
 * `weightsBytes`, a worker's resident growth when the model loaded; `peakBytes`, the most a batch took
 * above the loaded model (activations, arena growth); `peakPixels`, samples x pixels of that batch's model call;
 * `denoise` and `decode`, the same split by phase where the system can tell them apart (Linux).
 */
export type ModelMemory = z.infer<typeof modelMemory>;

/**
 * A model's figures as they stand for the version of its folder's files now: none when they were
 * measured of other files (another model installed under its id), which say nothing of these: an
 * SDXL's figures, kept for the small model installed in its place, planned that model's batches (its
 * calibration skipped) and were what `models list` showed for it. Either version unknown counts as the
 * same.
 */
export function figuresFor(known: ModelMemory | undefined, version: string | undefined): ModelMemory | undefined {
  return known && (known.version === undefined || version === undefined || known.version === version) ? known : undefined;
}

/** The figures of both, each the larger: what the plan counts on is the most a model was seen to take; `reported` alone when they are of other files (see figuresFor). */
export function mergeMemory(stored: ModelMemory | undefined, reported: ModelMemory): ModelMemory {
  const known = figuresFor(stored, reported.version);
  const version = reported.version ?? known?.version;
  const peak = known && known.peakBytes >= reported.peakBytes ? known : reported;
  const merged = (a?: MemorySample[], b?: MemorySample[]) => (a || b ? mergeSamples(a ?? [], b ?? []) : undefined);
  const denoise = merged(known?.denoise, reported.denoise);
  const exceeded = merged(known?.exceeded, reported.exceeded);
  const decode = !known?.decode || (reported.decode && reported.decode.bytes > known.decode.bytes) ? reported.decode : known.decode;
  return {
    weightsBytes: Math.max(known?.weightsBytes ?? 0, reported.weightsBytes),
    peakBytes: peak.peakBytes,
    peakPixels: peak.peakPixels,
    ...(denoise && { denoise }),
    ...(decode && { decode }),
    ...(exceeded && { exceeded }),
    ...(version !== undefined && { version }),
  };
}

/** The figures that say only that each of `samples` samples of `pixels` needed more than its share of `plannedBytes`. */
export function exceededFigures(pixels: number, plannedBytes: number, samples: number): ModelMemory {
  return { weightsBytes: 0, peakBytes: 0, peakPixels: 0, exceeded: [{ pixels, bytes: plannedBytes / samples }] };
}

/** What DATA_DIR keeps of a model's figures: all but its `exceeded` lessons, which last the server's lifetime. */
function kept({ exceeded: _lessons, ...measured }: ModelMemory): ModelMemory {
  return measured;
}

/** The figures file's name, less the suffixes of memoryFiguresFile. */
const FILE_STEM = 'model-memory';

/** The file a write goes through before its rename (see writeMemoryFigures): `model-memory[.<provider>][.<rewrites>].json.<pid>-<n>.tmp`. */
const ASIDE_FILE = new RegExp(`^${FILE_STEM}(\\.[a-z]+)*\\.json\\.\\d+-\\d+\\.tmp$`);
/**
 * A file written aside this long ago is a killed process's (SIGKILL or a crash between its write and its
 * rename, a Ctrl-C of `imagegen generate`): one left so stayed in DATA_DIR for good, one more each time.
 * A write takes milliseconds; younger ones may be another process's under way.
 */
const ASIDE_FILE_AGE_MS = 10 * 60_000;

/**
 * The file is `{ version, models }`. Version 6 no longer counts, as a run's denoising need, memory an
 * earlier larger run left held (see MemoryPlan.measureRun): version 5's figures of a server that met
 * mixed traffic can hold a small size at many times its need (83 MiB a sample at 512x512 for 23), which
 * the curve scales up by the square, refusing sizes that fit; clean ones cannot be told from them.
 * Version 5 measures FLUX transformers with their attention fused
 * on the CPU too: the test export's call at 1024x1024 peaked at 232 MiB instead of 527, a real one's
 * unfused scores take GiBs (version 4's figures of FLUX would refuse sizes that now fit). Version 4
 * measures graphs as src/runtime/graph-rewrite.ts loads them, attention fused on the CPU: without the
 * [tokens x tokens] scores the SD 1.5 export's UNet peaked at 241 MiB instead of 1049 at 512x512, so
 * version 3's figures would refuse sizes that now fit.
 * Version 3 measured them without the zero tensors of exported attention, version 2 with those: up to
 * three times the attention scores' size more (1 GiB more per 1024x1024 VAE decode). Version 1 (a
 * bare record of models, before the version field) counted the denoising per image, guidance or not:
 * read per sample it would overstate a guided image up to twice, and halved it would understate an
 * image without guidance (risking the OOM killer). None is safe to convert, so an older file is set
 * aside and the workers measure each model again as it loads.
 */
const VERSION = 6;
const figuresFile = z.object({ version: z.literal(VERSION), models: z.record(z.string(), modelMemory) });

/**
 * One file per execution provider: on a GPU a model's weights and activations sit in the GPU's memory,
 * so the figures measured there (host memory) would understate what the same model needs on the CPU.
 * Each provider keeps its own, and switching back finds them again. So does each set of graph
 * rewrites: graphs rewritten only where exact (GRAPH_REWRITES=exact) take more than fused ones.
 */
function memoryFiguresFile(dataDir: string, provider: ExecutionProvider, graphRewrites: GraphRewrites = 'all'): string {
  const parts = [FILE_STEM, ...(provider === 'cpu' ? [] : [provider]), ...(graphRewrites === 'all' ? [] : [graphRewrites]), 'json'];
  return path.join(dataDir, parts.join('.'));
}

/** Why a file's figures are not used: of an older version, of a newer one (this one cannot tell how it counted), or not readable as figures at all. */
export type SetAside = 'outdated' | 'newer' | 'unreadable';

/** The figures a file holds, or none and why (`setAside`; `readError`, the system's error where the file could not be read at all). */
async function readFigures(
  dataDir: string,
  provider: ExecutionProvider,
  graphRewrites?: GraphRewrites,
): Promise<{ figures: Record<string, ModelMemory>; setAside?: SetAside; readError?: NodeJS.ErrnoException }> {
  try {
    const content: unknown = (await readJsonIfPresent(memoryFiguresFile(dataDir, provider, graphRewrites))) ?? { version: VERSION, models: {} };
    const parsed = figuresFile.safeParse(content);
    if (parsed.success) return { figures: parsed.data.models };
    const version = typeof content === 'object' && content !== null && 'version' in content ? content.version : 1;
    const numbered = typeof version === 'number' ? version : VERSION;
    return { figures: {}, setAside: numbered < VERSION ? 'outdated' : numbered > VERSION ? 'newer' : 'unreadable' };
  } catch (err) {
    // A DATA_DIR that is a file, or not this user's to read, is no damaged file of figures.
    return { figures: {}, setAside: 'unreadable', readError: (err as NodeJS.ErrnoException).code ? (err as NodeJS.ErrnoException) : undefined };
  }
}

/** The figures measured on `provider` with the graphs rewritten by `graphRewrites` (see memoryFiguresFile). */
export async function readMemoryFigures(dataDir: string, provider: ExecutionProvider = 'cpu', graphRewrites?: GraphRewrites): Promise<Record<string, ModelMemory>> {
  return (await readFigures(dataDir, provider, graphRewrites)).figures;
}

/** The figures of one server: the most each model ever took, written through to DATA_DIR. */
export class MemoryFigures {
  private writing = Promise.resolve();

  private constructor(
    private readonly dataDir: string,
    private readonly provider: ExecutionProvider,
    private readonly graphRewrites: GraphRewrites | undefined,
    private readonly figures: Record<string, ModelMemory>,
    /** Why the file's figures were set aside, if they were (see VERSION); it is rewritten with the first new ones. */
    readonly setAside: SetAside | undefined,
    /** The system's error where the file could not be read at all (DATA_DIR a file, or not readable). */
    readonly readError: NodeJS.ErrnoException | undefined,
    private readonly onWriteError: (err: Error) => void,
  ) {}

  /**
   * The figures of models run on `provider`, their graphs rewritten by `graphRewrites`. `onWriteError`
   * hears of a write that failed (a full or read-only DATA_DIR): the figures still serve this server,
   * but the next one measures every model again.
   */
  static async open(dataDir: string, options: { provider?: ExecutionProvider; graphRewrites?: GraphRewrites; onWriteError?: (err: Error) => void } = {}): Promise<MemoryFigures> {
    const { provider = 'cpu', graphRewrites, onWriteError = () => undefined } = options;
    const { figures, setAside, readError } = await readFigures(dataDir, provider, graphRewrites);
    // A DATA_DIR that cannot be listed or written is said by readError, or by the first write.
    await deleteStaleFiles(dataDir, ASIDE_FILE, ASIDE_FILE_AGE_MS).catch(() => undefined);
    return new MemoryFigures(dataDir, provider, graphRewrites, figures, setAside, readError, onWriteError);
  }

  /** The file's name in DATA_DIR, for messages. */
  get fileName(): string {
    return path.basename(memoryFiguresFile(this.dataDir, this.provider, this.graphRewrites));
  }

  all(): Record<string, ModelMemory> {
    return { ...this.figures };
  }

  /** The figures kept of one model folder, if any. */
  of(modelDir: string): ModelMemory | undefined {
    return this.figures[modelDir];
  }

  /** Keeps the larger of the known and the reported figures, and returns them; writes the file when what it keeps grew. */
  record(modelDir: string, reported: ModelMemory): ModelMemory {
    const known = this.figures[modelDir];
    const next = mergeMemory(known, reported);
    this.figures[modelDir] = next;
    if (!known || !isDeepStrictEqual(kept(next), kept(known))) this.writing = this.writing.then(() => this.write()).catch((err: Error) => this.onWriteError(err));
    return next;
  }

  /** Waits for the last write (tests, shutdown). */
  flushed(): Promise<void> {
    return this.writing;
  }

  /**
   * Writes this process's figures over the file's as it is now, each model's the larger (mergeMemory): a
   * server and `imagegen generate` (or two servers) share DATA_DIR, and each wrote what it had read at its
   * start with what it measured since, so a command's write dropped the figures the server measured
   * meanwhile, and the server's next one the command's: the model was calibrated again by the next
   * command or server. Two writes at the same moment can still lose one of them (the last rename wins).
   */
  private async write(): Promise<void> {
    const { figures: written } = await readFigures(this.dataDir, this.provider, this.graphRewrites);
    const mine = Object.entries(this.figures).map(([dir, figures]) => [dir, mergeMemory(written[dir], kept(figures))]);
    await writeMemoryFigures(this.dataDir, { ...written, ...Object.fromEntries(mine) }, this.provider, this.graphRewrites);
  }
}

/** Where a process that plans with DATA_DIR's figures says what became of them: `info`, what is expected (a file of an older version); `warn`, what is not. */
export interface FiguresLog {
  info(message: string): void;
  warn(message: string, err?: Error): void;
}

/**
 * DATA_DIR's figures for `provider` and `graphRewrites`, as the server and the commands that run a model
 * in their own process (generate, models verify) plan with them and keep what they measure: a file set
 * aside (older or damaged) and a write that fails are said to `log`. Reading none, the commands
 * calibrated every model they ran, every time (tens of seconds for an SDXL on a CPU).
 */
export async function openKeptFigures(dataDir: string, options: { provider: ExecutionProvider; graphRewrites: GraphRewrites }, log: FiguresLog): Promise<MemoryFigures> {
  /** What to do about DATA_DIR for a read or write that failed with `err`. */
  const advice = (err: NodeJS.ErrnoException): string => {
    if (isDiskFull(err)) return 'free space in DATA_DIR';
    if (err.code === 'ENOTDIR' || err.code === 'EEXIST') return `DATA_DIR (${dataDir}) is a file, or a folder on its path is: set DATA_DIR to a folder`;
    if (err.code === 'EISDIR') return `${memoryFiguresFile(dataDir, options.provider, options.graphRewrites)} is a folder, where the figures' file should be: remove it`;
    return `let this user read and write DATA_DIR (${dataDir})`;
  };
  const figures = await MemoryFigures.open(dataDir, {
    ...options,
    onWriteError: (err) =>
      log.warn(
        `the models' memory figures cannot be written to ${file} (${codeOrMessage(err)}): they serve this process, but the next server or command measures each model again as it first loads; ${advice(err)}`,
        err,
      ),
  });
  const file = `DATA_DIR/${figures.fileName}`;
  if (figures.setAside === 'outdated') {
    log.info(`the memory figures in ${file} were measured by an older version, which counted differently: set aside; each model is measured again as it first loads`);
  } else if (figures.setAside === 'newer') {
    // Not damaged: a server rolled back after an upgrade (or sharing DATA_DIR with a newer one) reads it so.
    log.warn(`the memory figures in ${file} were written by a newer version of imagegen, whose format this one cannot read: not used; each model is measured again as it first loads, and the file is rewritten in this version's format (the newer version measures again in turn)`);
  } else if (figures.readError) {
    log.warn(`${file} cannot be read (${figures.readError.code}): each model is measured again as it first loads; ${advice(figures.readError)}`);
  } else if (figures.setAside === 'unreadable') {
    log.warn(`${file} cannot be read as memory figures (damaged?): set aside; each model is measured again as it first loads, and the file is rewritten`);
  }
  return figures;
}

/** Numbers this process's writes of figures files apart (see writeMemoryFigures). */
let writes = 0;

/**
 * Writes figures to DATA_DIR in this version's format, aside and renamed so that a crash never leaves
 * half a file. Aside under a name of its own: processes that share DATA_DIR (two servers, a server and
 * `imagegen generate`) wrote the same temporary file at once, which left one of them a garbled file or
 * a failed rename. The last rename wins, a whole file either way.
 */
export async function writeMemoryFigures(dataDir: string, models: Record<string, ModelMemory>, provider: ExecutionProvider = 'cpu', graphRewrites?: GraphRewrites): Promise<void> {
  const file = memoryFiguresFile(dataDir, provider, graphRewrites);
  const aside = `${file}.${process.pid}-${writes++}.tmp`;
  await mkdir(dataDir, { recursive: true });
  try {
    await writeFile(aside, JSON.stringify({ version: VERSION, models }, null, 1));
    await rename(aside, file);
  } catch (err) {
    // A full disk: no empty file left behind.
    await unlink(aside).catch(() => undefined);
    throw err;
  }
}
