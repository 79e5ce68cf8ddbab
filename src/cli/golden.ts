import { readFile } from 'node:fs/promises';
import path from 'node:path';
import sharp from 'sharp';
import { z } from 'zod';
import { MAX_STEPS, type GenerationBatch, type ModelRef } from '../runtime/types.js';
import type { WorkerRuntime } from '../pipelines/run.js';
import { describeIssues, readJsonIfPresent } from '../util/files.js';
import { difference } from '../util/difference.js';
import { inspectModel, MODEL_INDEX, type ModelLayout } from '../models/layout.js';
import { folderVersion } from '../models/registry.js';
import { familyEntry } from '../families/index.js';
import { latentChannels } from '../pipelines/latent-channels.js';
import { messageOf, whyUnreadable } from '../util/error-message.js';
import { GoldenFileError } from './golden-error.js';
import { DEFAULT_TOLERANCE } from './tolerance.js';

/**
 * `imagegen models verify`: runs a model on the cases of a golden file (what diffusers' PyTorch
 * pipeline made on the same weights from given starting noise, see docs/verify.md) and measures how far
 * our pictures are from diffusers'. A case is fully determined by its noise, prompt and settings, so
 * any difference is ours: tokenizer, scheduler, guidance, conditioning, VAE.
 */

const latentsFile = z.object({
  file: z.string(),
  dtype: z.literal('float32'),
  byteorder: z.literal('little').optional(),
  shape: z.array(z.number().int().positive()),
});

const goldenCase = z.object({
  prompt: z.string(),
  /** null: none given (SDXL then zeroes its negative conditioning, as diffusers does). */
  negative_prompt: z.string().nullish(),
  steps: z.number().int().positive().max(MAX_STEPS),
  guidance: z.number(),
  width: z.number().int().positive(),
  height: z.number().int().positive(),
  seed: z.number().int().nonnegative(),
  /** FLUX: the tokens its T5 encoder was run at (diffusers' FluxPipeline argument; its default is 512). */
  max_sequence_length: z.number().int().positive().optional(),
  latents: latentsFile,
  image: z.object({ file: z.string() }),
});

/** `pipeline`: the diffusers class that made the pictures (optional; checked against the model's own). */
const goldenFile = z.object({ pipeline: z.string().optional(), cases: z.array(goldenCase).min(1) });
type GoldenFile = z.infer<typeof goldenFile>;

export type GoldenCase = z.infer<typeof goldenCase>;

export interface CaseResult {
  index: number;
  maxAbs: number;
  meanAbs: number;
  pass: boolean;
}

/** What a file of case `index` that cannot be read is reported as, naming what it was to be (a catch handler). */
const unreadable =
  (file: string, index: number, what: string) =>
  (err: Error): never => {
    throw new GoldenFileError(file, `(case ${index}'s ${what}) cannot be read: ${err.message}`);
  };

/** Where the user learns what a golden file holds and how to make one: every message about the file itself names it. */
const GOLDEN_DOCS = 'docs/verify.md, "The golden file"';

async function readGoldenFile(file: string): Promise<GoldenFile> {
  const text = await readFile(file, 'utf8').catch((err: unknown) => {
    throw new GoldenFileError(file, `${whyUnreadable(err)}: give --golden the path of the model's golden file (${GOLDEN_DOCS}, says what one holds and how to make it with diffusers)`);
  });
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (err) {
    throw new GoldenFileError(file, `is not JSON (${messageOf(err)}): a golden file is the JSON that ${GOLDEN_DOCS}, describes`);
  }
  const parsed = goldenFile.safeParse(json);
  if (!parsed.success) throw new GoldenFileError(file, `not a golden file: ${describeIssues(parsed.error)} (${GOLDEN_DOCS}, lists the fields it takes)`);
  return parsed.data;
}

export async function readGolden(file: string): Promise<GoldenCase[]> {
  return (await readGoldenFile(file)).cases;
}

/** A diffusers pipeline class as its ONNX exports name it too: Optimum writes ORT..., the legacy exporter Onnx.... */
const pipelineName = (className: string) => className.replace(/^(ORT|Onnx)/, '');

/**
 * Refuses a golden file made by another pipeline than the model's (model_index.json's `_class_name`):
 * its cases would only FAIL, or fail to run, and say nothing of the model. Either side unnamed: no check.
 */
async function checkPipeline(file: string, golden: GoldenFile, modelDir: string): Promise<void> {
  const modelIndex = (await readJsonIfPresent(path.join(modelDir, MODEL_INDEX)).catch(() => undefined)) as { _class_name?: unknown } | undefined;
  const modelClass = typeof modelIndex?._class_name === 'string' ? modelIndex._class_name : undefined;
  if (!golden.pipeline || !modelClass || pipelineName(golden.pipeline) === pipelineName(modelClass)) return;
  throw new GoldenFileError(file, `was made by diffusers' ${golden.pipeline}, and ${modelDir} is a ${modelClass} (its model_index.json): use this model's own golden file`);
}

/**
 * Refuses cases whose T5 encoder ran at another length than the model's here (its family's
 * secondEncoderLength: 256 tokens for FLUX schnell, as its model card runs it, where diffusers'
 * FluxPipeline defaults to 512): the prompt would be conditioned differently, and every such case FAIL
 * without saying why.
 */
function checkTextLength(file: string, golden: GoldenFile, layout: Pick<ModelLayout, 'family' | 'variant'>): void {
  const length = familyEntry(layout.family).secondEncoderLength?.[layout.variant];
  const index = golden.cases.findIndex((c) => c.max_sequence_length !== undefined && length !== undefined && c.max_sequence_length !== length);
  if (index < 0) return;
  throw new GoldenFileError(
    file,
    `case ${index} was made with max_sequence_length=${golden.cases[index].max_sequence_length}, and this server runs a ${layout.variant} model's T5 encoder at ${length} tokens: make the golden file with max_sequence_length=${length} in the pipeline's call`,
  );
}

/** The VAE's scale, image pixels per latent pixel: 8 for every family this server runs (README). */
const LATENT_SCALE = 8;

/** A case's starting noise, [1, C, H/8, W/8] float32 as written by numpy's `tofile`; `channels`: the model's C. */
async function readLatents(goldenDir: string, c: GoldenCase, index: number, channels: number): Promise<Float32Array> {
  const { file, shape } = c.latents;
  const expected = [1, channels, c.height / LATENT_SCALE, c.width / LATENT_SCALE];
  // Noise of another size (another case's file) or channel count (another family's golden) is the golden file's mistake: named here, not by the pipeline as a count of values.
  if (shape.length !== 4 || shape.some((side, axis) => side !== expected[axis])) {
    throw new GoldenFileError(
      file,
      `(case ${index}'s initial latents) has the shape [${shape.join(', ')}]; a case of ${c.width}x${c.height} on this model starts from [${expected.join(', ')}] (its latent channels, and its height and width / ${LATENT_SCALE})`,
    );
  }
  const bytes = await readFile(path.resolve(goldenDir, file)).catch(unreadable(file, index, 'initial latents'));
  const count = shape.reduce((a, b) => a * b, 1);
  if (bytes.byteLength !== count * 4) {
    throw new GoldenFileError(file, `holds ${bytes.byteLength} bytes; shape [${shape.join(', ')}] needs ${count * 4}`);
  }
  // Copied so the floats are aligned whatever the Buffer's offset in its pool.
  return new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
}

/** What a case compares against and starts from, read and checked. */
interface CaseFiles {
  /** diffusers' picture, 8-bit RGB. */
  expected: Buffer;
  initialNoise: Float32Array;
}

/** A case's files, for a model whose noise has `channels`; throws GoldenFileError naming the one that cannot be used. */
async function readCaseFiles(goldenDir: string, c: GoldenCase, index: number, channels: number): Promise<CaseFiles> {
  const expected = await sharp(path.resolve(goldenDir, c.image.file))
    .removeAlpha()
    .raw()
    .toBuffer({ resolveWithObject: true })
    .catch(unreadable(c.image.file, index, 'expected image'));
  if (expected.info.width !== c.width || expected.info.height !== c.height) {
    throw new GoldenFileError(c.image.file, `is ${expected.info.width}x${expected.info.height}; the case asks for ${c.width}x${c.height}`);
  }
  return { expected: expected.data, initialNoise: await readLatents(goldenDir, c, index, channels) };
}

/**
 * The batch that replays one case: its noise, prompt and settings, with torch's generator for any later
 * draws. At the version of the model folder's files, as a server's batches are: the memory figures it
 * measures are kept with it (see cli/command-runtime.ts), and other files in the folder later are measured afresh.
 */
function batchFor(model: ModelRef, c: GoldenCase, initialNoise: Float32Array): GenerationBatch {
  return {
    modelDir: model.dir,
    modelVersion: model.version,
    width: c.width,
    height: c.height,
    steps: c.steps,
    guidanceScale: c.guidance,
    items: [{ prompt: c.prompt, negativePrompt: c.negative_prompt ?? undefined, seed: c.seed, rng: 'torch', initialNoise }],
  };
}

async function runCase(
  runtime: WorkerRuntime,
  model: ModelRef,
  c: GoldenCase,
  index: number,
  { expected, initialNoise }: CaseFiles,
  tolerance: number,
  onStep?: (step: number, total: number) => void,
): Promise<CaseResult> {
  const [image] = await runtime.generateImages(batchFor(model, c, initialNoise), { onStep });
  const { largest, mean } = difference(image.pixels, expected);
  const [maxAbs, meanAbs] = [largest / 255, mean / 255];
  return { index, maxAbs, meanAbs, pass: maxAbs <= tolerance };
}

/** One case, its files read from `goldenDir` (the tests run single cases, some of them changed: see verifyGolden for a whole file). */
export async function verifyCase(runtime: WorkerRuntime, modelDir: string, goldenDir: string, c: GoldenCase, index: number, tolerance: number): Promise<CaseResult> {
  // The case's files are read and checked first: a golden file naming one it cannot use fails before the model runs.
  const channels = latentChannels(await inspectModel(modelDir));
  return runCase(runtime, await modelAt(modelDir), c, index, await readCaseFiles(goldenDir, c, index, channels), tolerance);
}

/** What the caller of verifyGolden hears as the cases run (a real model's case takes minutes on a CPU). */
export interface VerifyHooks {
  /** The file was read and suits the model: these cases run next. */
  onStart?(cases: readonly GoldenCase[]): void;
  /** Case `index` begins: the callback for the steps of its denoising, if any. */
  onCaseStart?(index: number): ((step: number, total: number) => void) | undefined;
  /** Each case's result as it comes. */
  onCase?(result: CaseResult): void;
}

/** The model folder `dir`, absolute as the server's are (its memory figures are keyed so), at the version of its files now. */
async function modelAt(dir: string): Promise<ModelRef> {
  const absolute = path.resolve(dir);
  return { dir: absolute, version: await folderVersion(absolute) };
}

/** Every case of a golden file, one after the other. */
export async function verifyGolden(runtime: WorkerRuntime, modelDir: string, file: string, tolerance = DEFAULT_TOLERANCE, hooks: VerifyHooks = {}): Promise<CaseResult[]> {
  const golden = await readGoldenFile(file);
  await checkPipeline(file, golden, modelDir);
  // A folder that holds no usable model is said before any progress is shown (loading it says so too, but only once the first case starts).
  const layout = await inspectModel(modelDir);
  checkTextLength(file, golden, layout);
  // Every case's files before any case runs: one runs for minutes on a real model, and a later case's missing picture would fail the command after them.
  const goldenDir = path.dirname(path.resolve(file));
  const channels = latentChannels(layout);
  const files: CaseFiles[] = [];
  for (const [index, c] of golden.cases.entries()) files.push(await readCaseFiles(goldenDir, c, index, channels));
  const model = await modelAt(modelDir);
  hooks.onStart?.(golden.cases);
  const results: CaseResult[] = [];
  for (const [index, c] of golden.cases.entries()) {
    const result = await runCase(runtime, model, c, index, files[index], tolerance, hooks.onCaseStart?.(index));
    hooks.onCase?.(result);
    results.push(result);
  }
  return results;
}
