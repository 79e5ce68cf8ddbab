import { readdir, stat } from 'node:fs/promises';
import path from 'node:path';
import { halvings } from '../families/family.js';
import { DENOISER_FOLDERS, FAMILIES, familyEntry, recogniseFamily } from '../families/index.js';
import { checkSchedule, SCHEDULE_CHECK_STEPS, standInFor, type StrengthRule } from '../schedulers/index.js';
import type { ModelKind, SchedulerConfig } from '../schedulers/scheduler.js';
import { findTokenizerSource, TokenizerFilesError } from '../tokenizers/files.js';
import { exists, readJsonIfPresent } from '../util/files.js';
import { externalDataProblem } from './onnx-external-data.js';
import { isTensorRtEngine, tensorRtProblem } from './tensorrt.js';
import { messageOf } from '../util/error-message.js';

/**
 * Recognises a model folder in any of the export conventions (legacy diffusers script, Optimum) by
 * probing for component folders rather than trusting `model_index.json`, whose component names differ
 * between exporters (Optimum keeps the original pipeline's `vae`). Which family it is, and what that
 * implies (variant, sizes, VAE factors), its entry in the family registry (src/families/) decides.
 */

export interface ModelLayout {
  dir: string;
  /** Its entry's name in the family registry (src/families/). */
  family: string;
  /** One of its family's variants. */
  variant: string;
  /** Pixel side the denoiser was trained at, when its config says (its family's nativeSize(): a UNet's `sample_size` x the VAE's scale). */
  nativeSize?: number;
  textEncoder: string;
  textEncoder2?: string;
  /** UNet (SD, SDXL) or transformer (FLUX). */
  denoiser: string;
  vaeDecoder: string;
  /** The VAE encoder, which image-to-image needs (text-to-image does not). */
  vaeEncoder?: string;
  tokenizer: string;
  tokenizer2?: string;
  /** What its schedulers run from: scheduler_config.json, or, for a class this server does not run, its stand-in's (schedulerStandIn). */
  scheduler: SchedulerConfig;
  /** The class scheduler_config.json names (none: it names none), when this server does not run it (or, `why`, its settings), and the scheduler that runs instead (schedulers/index.ts standInFor). */
  schedulerStandIn?: { named?: string; by: string; why?: string };
  /** What its schedulers are (its family's): 'flow' pipelines also read image-to-image's strength their own way (schedulers/strength.ts). */
  schedulerKind: ModelKind;
  /**
   * `scaleFactor`: image pixels per latent pixel along a side (8 for every released VAE).
   * `midBlockAttention`: the decoder attends over every latent pixel (every released VAE does; its
   * config can say `mid_block_add_attention: false`), which sets its memory at large sizes.
   */
  vae: { scalingFactor: number; shiftFactor: number; scaleFactor: number; midBlockAttention: boolean };
  /** Image sides must be multiples of this, or the denoiser's graph fails (its family's sizeMultiple()). */
  sizeMultiple: number;
  /** Optional `config.json` of the denoiser (Optimum exports have one). */
  denoiserConfig: Record<string, unknown>;
  /**
   * SDXL: a batch item with no negative prompt conditions on zeros rather than on the empty prompt's
   * encoding (diffusers' force_zeros_for_empty_prompt, read from model_index.json, true unless it says false).
   */
  forceZerosForEmptyPrompt: boolean;
}

/**
 * How image-to-image with this model reads its strength (schedulers/strength.ts), as diffusers'
 * AutoPipelineForImage2Image would run it: an SD model distilled as a latent consistency model (its
 * UNet takes the guidance as an embedding, time_cond_proj_dim) has a pipeline of its own, which reads
 * the strength through LCMScheduler; with another scheduler, and every other model, the pipeline of its
 * kind. `scheduler`: the name a request asked for (none: the model's own).
 */
export function strengthRule(layout: Pick<ModelLayout, 'family' | 'scheduler' | 'schedulerKind' | 'denoiserConfig'>, scheduler?: string): StrengthRule {
  const lcm = scheduler === undefined ? layout.scheduler._class_name === 'LCMScheduler' : scheduler === 'lcm';
  return lcm && layout.family === 'sd' && layout.denoiserConfig.time_cond_proj_dim != null ? 'consistency' : layout.schedulerKind;
}

/**
 * The scheduler config an SD 1.x/2.x model's generations run from. diffusers' pipelines for them
 * (StableDiffusionPipeline, its image-to-image and inpainting ones, and their ONNX versions) rewrite an
 * outdated scheduler_config.json as they load it: steps_offset becomes 1, whatever the file says or its
 * class defaults to (0, which shifts every leading timestep down by one), and clip_sample false (DDIM
 * defaults to clipping the predicted x0 to [-1, 1], meant for pixel-space models, which wrecks latents).
 * A scheduler a request names is made, as diffusers' from_config makes it, from that rewritten config
 * less the values its class only defaulted: steps_offset 1 where the file names one, the named class's
 * own default where it does not (clip_sample is off there anyway: schedulers/index.ts switchedConfig).
 * SDXL's pipelines and the latent consistency one (a UNet distilled to take the guidance as an input)
 * rewrite nothing. `scheduler`: the name a request asked for (none: the model's own).
 */
export function pipelineScheduler(layout: Pick<ModelLayout, 'family' | 'scheduler' | 'denoiserConfig'>, scheduler?: string): SchedulerConfig {
  const own = layout.scheduler;
  if (layout.family !== 'sd' || layout.denoiserConfig.time_cond_proj_dim != null) return own;
  const namesOffset = own.steps_offset !== undefined && own.steps_offset !== null;
  return { ...own, clip_sample: false, ...((scheduler === undefined || namesOffset) && { steps_offset: 1 }) };
}

/** Whether the model's variant runs any guidance (see VariantPreset.takesGuidance). */
export function takesGuidance(layout: Pick<ModelLayout, 'family' | 'variant'>): boolean {
  return familyEntry(layout.family).variants[layout.variant].takesGuidance !== false;
}

/**
 * Whether the model can use a negative prompt: only a classifier-free batch (an unconditional copy,
 * conditioned on it, which guidance above 1 adds) reads one. SD and SDXL UNets run one, but those
 * distilled as latent consistency models, which take the guidance as an embedding (time_cond_proj_dim);
 * FLUX never does (dev takes its guidance as an input). The pipeline itself asks its graph for
 * `timestep_cond` (StableDiffusionPipeline.samplesPerImage): an LCM export without a config.json is let through here.
 */
export function takesNegativePrompt(layout: Pick<ModelLayout, 'family' | 'denoiserConfig'>): boolean {
  return familyEntry(layout.family).pipeline === 'stable-diffusion' && layout.denoiserConfig.time_cond_proj_dim == null;
}

/** What a model whose scheduler class is not run here is told (models list, the server's log). */
export function standInNote({ named, by, why }: NonNullable<ModelLayout['schedulerStandIn']>): string {
  const what = named === undefined ? 'names no scheduler class (_class_name)' : `names ${named}${why ? ` with ${why}` : ''}, which this server does not run`;
  return `its scheduler_config.json ${what}: ${by} stands in, with the same training schedule (a request's 'scheduler' may pick another)`;
}

/**
 * `text` (a problem, an error's message) with the paths of files in the model folder `dir` made
 * relative to it: reasons reach clients (/ready, 500 model_unusable), which the server's paths are not for.
 */
export function withinFolder(dir: string, text: string): string {
  return text.replaceAll(`${path.resolve(dir)}${path.sep}`, '');
}

/** The file at the top of every diffusers-layout export. */
export const MODEL_INDEX = 'model_index.json';

/** ModelLayoutError.problem of a folder that is not there (a model removed since it was listed). */
export const MISSING_FOLDER = 'the folder does not exist';

export class ModelLayoutError extends Error {
  /**
   * What is wrong, without the folder: the reason `imagegen models list`, /ready, the log and a 500
   * model_unusable give. The files it names are relative to the folder, whichever reader's message it
   * carries (a JSON parser's, a tokenizer's name their files by their full paths).
   */
  readonly problem: string;

  constructor(
    readonly dir: string,
    problem: string,
    /** `problem` ends in what to do about it (a damaged graph: copy it again from the export), which an install's message then does not repeat. */
    readonly saysWhatToDo = false,
  ) {
    const relative = withinFolder(dir, problem);
    super(`${dir} is not a usable model folder: ${relative}`);
    this.name = 'ModelLayoutError';
    this.problem = relative;
  }
}

/**
 * What a failure that came while a model's folder was read says, once the folder is found removed
 * (`models remove` meanwhile): that it was removed, rather than whichever of its files went first
 * failing in its own words ("File doesn't exist", ENOENT), which read as a model to repair. `err` itself
 * while the folder is there.
 */
export async function removedOr(dir: string, err: unknown): Promise<unknown> {
  return (await exists(dir)) ? err : new ModelLayoutError(dir, MISSING_FOLDER);
}

/** A config file of the model folder `root`, or undefined when it has none. */
async function readJson(root: string, file: string): Promise<Record<string, unknown> | undefined> {
  try {
    return (await readJsonIfPresent(file)) as Record<string, unknown> | undefined;
  } catch (err) {
    throw new ModelLayoutError(root, messageOf(err));
  }
}

/** The tokenizer folder, or undefined when it has no tokenizer; one that lacks a companion file is named at once. */
async function findTokenizer(dir: string, folder: string): Promise<string | undefined> {
  const tokDir = path.join(dir, folder);
  try {
    await findTokenizerSource(tokDir);
    return tokDir;
  } catch (err) {
    if (err instanceof TokenizerFilesError && err.partial) throw new ModelLayoutError(dir, err.message);
    if (err instanceof TokenizerFilesError) return undefined;
    throw err;
  }
}

/** The sub-folders of `root` that hold a model.onnx. */
async function componentsOf(root: string): Promise<Set<string>> {
  const entries = await readdir(root, { withFileTypes: true });
  const folders = entries.filter((entry) => entry.isDirectory() || entry.isSymbolicLink()).map((entry) => entry.name);
  const found = await Promise.all(folders.map(async (folder) => ((await exists(path.join(root, folder, 'model.onnx'))) ? [folder] : [])));
  return new Set(found.flat());
}

/** The folders in `root` that are models themselves (they hold a denoiser's graph), sorted; hidden ones (an install's .staging) left out. */
async function modelFoldersIn(root: string): Promise<string[]> {
  const names = (await readdir(root)).filter((name) => !name.startsWith('.')).sort();
  const isModel = async (name: string) => (await Promise.all(DENOISER_FOLDERS.map((folder) => exists(path.join(root, name, folder, 'model.onnx'))))).some(Boolean);
  const found = await Promise.all(names.map(async (name) => ((await isModel(name)) ? [name] : [])));
  return found.flat();
}

/**
 * Why a folder of model folders is no model: MODELS_DIR set one level above the models (a disk's root,
 * the models folder's parent), or a verify of the folder that holds several exports. Said so, with
 * what to do, where "missing unet/model.onnx, ..." read as a model to repair. No path: a 500 carries it.
 */
function holdsModelsProblem(models: string[]): string {
  const shown = models.slice(0, 5).join(', ') + (models.length > 5 ? ', ...' : '');
  return (
    `it holds model folders (${shown}), one per model, rather than a model's parts: to serve them, set MODELS_DIR to this folder itself; ` +
    'to install or verify one, give its own folder'
  );
}

const className = (config: Record<string, unknown> | undefined) => (typeof config?._class_name === 'string' ? config._class_name : undefined);

/** Why no family took the folder: what it showed, and what this server runs. */
function unknownFamily(denoiserFolder: string, denoiserConfig: Record<string, unknown>, modelIndex: Record<string, unknown> | undefined): string {
  const classes = [className(denoiserConfig) && `${denoiserFolder}/config.json names ${className(denoiserConfig)}`, className(modelIndex) && `model_index.json names ${className(modelIndex)}`];
  const shown = classes.filter(Boolean).join(', ') || `it has ${denoiserFolder}/ but no class names`;
  return `no model family here recognises it (${shown}); this server runs ${FAMILIES.map((f) => f.name).join(', ')} models (docs/adding-a-model-family.md says how to add one)`;
}

/**
 * What the model's schedulers run from: its scheduler_config.json, or its stand-in's where this server
 * does not run its class (standInFor); a config that cannot make a schedule is the folder's problem.
 */
function runnableScheduler(root: string, own: SchedulerConfig, kind: ModelKind): { standIn: ReturnType<typeof standInFor>; schedulerConfig: SchedulerConfig } {
  let standIn: ReturnType<typeof standInFor>;
  try {
    standIn = standInFor(own, kind);
  } catch (err) {
    throw new ModelLayoutError(root, `scheduler/scheduler_config.json: ${messageOf(err)}`);
  }
  const schedulerConfig = standIn?.config ?? own;
  try {
    // Given a schedule too: what only set_timesteps reads (timestep_spacing, final_sigmas_type) would
    // otherwise load as ready and fail every request, blaming its steps.
    checkSchedule(schedulerConfig, undefined, SCHEDULE_CHECK_STEPS);
  } catch (err) {
    throw new ModelLayoutError(root, `scheduler/scheduler_config.json${standIn ? ` (as ${standIn.name})` : ''}: ${messageOf(err)}`);
  }
  return { standIn, schedulerConfig };
}

export async function inspectModel(dir: string): Promise<ModelLayout> {
  const root = path.resolve(dir);
  if (!(await exists(root))) throw new ModelLayoutError(root, MISSING_FOLDER);
  // `models verify` of a bundle, or of a model's file: Node's words were 'ENOTDIR: not a directory, scandir'.
  if (!(await stat(root)).isDirectory()) {
    throw new ModelLayoutError(root, 'it is a file, not a folder: give the folder of the model\'s export (a bundle is installed with "imagegen models import", or unpacked with "tar xf")', true);
  }
  const missing: string[] = [];

  const components = await componentsOf(root);
  /** The graph of the first of `folders` that has one. */
  const graph = (...folders: string[]) => {
    const folder = folders.find((f) => components.has(f));
    return folder && path.join(root, folder, 'model.onnx');
  };
  const denoiserFolder = DENOISER_FOLDERS.find((folder) => components.has(folder));
  const denoiser = denoiserFolder && path.join(root, denoiserFolder, 'model.onnx');
  if (!denoiser) missing.push(DENOISER_FOLDERS.map((folder) => `${folder}/model.onnx`).join(' or '));
  const textEncoder = graph('text_encoder');
  if (!textEncoder) missing.push('text_encoder/model.onnx');
  const textEncoder2 = graph('text_encoder_2');
  const vaeDecoder = graph('vae_decoder', 'vae');
  const vaeEncoder = graph('vae_encoder');
  if (!vaeDecoder) missing.push('vae_decoder/model.onnx');
  const tokenizer = await findTokenizer(root, 'tokenizer');
  if (!tokenizer) missing.push('tokenizer/ (tokenizer.json or vocab.json + merges.txt)');
  const tokenizer2 = textEncoder2 ? await findTokenizer(root, 'tokenizer_2') : undefined;
  if (textEncoder2 && !tokenizer2) missing.push('tokenizer_2/ (text_encoder_2 needs it)');
  const scheduler = await readJson(root, path.join(root, 'scheduler', 'scheduler_config.json'));
  if (!scheduler) missing.push('scheduler/scheduler_config.json');
  const denoiserConfig = (denoiser && (await readJson(root, path.join(path.dirname(denoiser), 'config.json')))) || {};
  const modelIndex = await readJson(root, path.join(root, MODEL_INDEX));
  const family = denoiserFolder
    ? recogniseFamily({ components, denoiserFolder, denoiserClass: className(denoiserConfig), pipelineClass: className(modelIndex) })
    : undefined;
  for (const { component, why } of family?.requires ?? []) if (!components.has(component)) missing.push(`${component}/model.onnx (${why})`);
  // Each one absent is named in `missing`; listed here too for the compiler, which cannot tell.
  if (missing.length || !denoiserFolder || !denoiser || !textEncoder || !vaeDecoder || !tokenizer) {
    const models = denoiser ? [] : await modelFoldersIn(root);
    if (models.length) throw new ModelLayoutError(root, holdsModelsProblem(models), true);
    const engines = (await readdir(root, { recursive: true })).filter(isTensorRtEngine);
    throw new ModelLayoutError(root, engines.length ? tensorRtProblem(engines) : `missing ${missing.join(', ')}`, engines.length > 0);
  }
  // The VAE encoder too, though only edits load it: damaged, it would fail each of them with a 500 while the folder passed as usable.
  for (const file of [textEncoder, textEncoder2, denoiser, vaeDecoder, vaeEncoder]) {
    const problem = file && (await externalDataProblem(file, root));
    if (problem) throw new ModelLayoutError(root, problem, true);
  }
  if (!family) throw new ModelLayoutError(root, unknownFamily(denoiserFolder, denoiserConfig, modelIndex), true);
  const ownScheduler = scheduler as SchedulerConfig;
  const { standIn, schedulerConfig } = runnableScheduler(root, ownScheduler, family.schedulerKind);

  const vaeConfig = (await readJson(root, path.join(path.dirname(vaeDecoder), 'config.json'))) ?? {};
  const vaeScale = halvings(vaeConfig.block_out_channels) ?? 8;

  return {
    dir: root,
    family: family.name,
    variant: family.variantOf({ scheduler: ownScheduler, denoiserConfig, modelIndex }),
    nativeSize: family.nativeSize(vaeScale, denoiserConfig),
    textEncoder,
    textEncoder2,
    denoiser,
    vaeDecoder,
    vaeEncoder,
    tokenizer,
    tokenizer2,
    scheduler: schedulerConfig,
    ...(standIn && {
      schedulerStandIn: { named: typeof ownScheduler._class_name === 'string' ? ownScheduler._class_name : undefined, by: standIn.name, ...(standIn.why && { why: standIn.why }) },
    }),
    schedulerKind: family.schedulerKind,
    vae: {
      scalingFactor: typeof vaeConfig.scaling_factor === 'number' ? vaeConfig.scaling_factor : family.vae.scalingFactor,
      shiftFactor: typeof vaeConfig.shift_factor === 'number' ? vaeConfig.shift_factor : family.vae.shiftFactor,
      scaleFactor: vaeScale,
      midBlockAttention: vaeConfig.mid_block_add_attention !== false,
    },
    sizeMultiple: family.sizeMultiple(vaeScale, denoiserConfig),
    denoiserConfig,
    forceZerosForEmptyPrompt: modelIndex?.force_zeros_for_empty_prompt !== false,
  };
}
