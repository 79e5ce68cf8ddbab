import { access, rm, stat, writeFile } from 'node:fs/promises';
import { constants, rmdirSync } from 'node:fs';
import path from 'node:path';
import type { Command } from 'commander';
import { EMBEDDED_MODELS_DIR, loadModelSettings } from '../config.js';
import { isDiskFull, makeFolder } from '../util/files.js';
import { IMAGE_FORMATS } from '../runtime/types.js';
import { ApiError } from '../api/errors.js';
import { Progress, STEPS } from '../util/progress.js';
import { exitStatusOf, UsageError } from './exit-status.js';
import { fileProblem } from './file-problem.js';
import { pathArgument } from './path-argument.js';
import { shellWord } from '../util/shell-word.js';
import { codeOrMessage, messageOf } from '../util/error-message.js';

/**
 * `imagegen generate`: the same request the HTTP route takes, run in this process without a server,
 * with a progress bar over the denoising steps. The flags are the request's fields, validated by the
 * same schema, so the command and the API cannot drift apart.
 */

interface GenerateFlags {
  model?: string;
  size?: string;
  n: string;
  seed?: string;
  steps?: string;
  guidanceScale?: string;
  negativePrompt?: string;
  scheduler?: string;
  rng?: string;
  quality?: string;
  style?: string;
  format: string;
  out: string;
  modelsDir?: string;
}

/** A decimal number as typed, such as 7, -1.5 or 1e3; Number() alone would take '' for 0 and 'abc' for NaN. */
const NUMBER = /^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?$/i;

/** A numeric flag's value, for the request schema to check the range of. */
function numberFlag(flag: string, value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  if (!NUMBER.test(value.trim())) throw new UsageError(`${flag} takes a number, not '${value}'`);
  return Number(value);
}

/** The flag of each request field (where the names differ), for the request's errors; the prompt is the argument, as usage names it. */
const FLAG_OF_FIELD: Record<string, string> = { prompt: '<prompt>', output_format: '--format', guidance_scale: '--guidance-scale', negative_prompt: '--negative-prompt' };
const flagOf = (field: string) => FLAG_OF_FIELD[field] ?? `--${field}`;

/**
 * The output folder, made if need be and checked writable before any work is spent on pictures it could
 * not hold. Returns the folders it made, outermost first (see intoOut).
 */
async function prepareOut(dir: string): Promise<string[]> {
  try {
    if (!dir) throw Object.assign(new Error('no folder named'), { code: 'ENOENT' });
    const made = await makeFolder(dir);
    await access(dir, constants.W_OK);
    return made;
  } catch (err) {
    const { code } = err as NodeJS.ErrnoException;
    const why = code === 'EEXIST' || code === 'ENOTDIR' ? 'is a file, not a folder' : code === 'EACCES' || code === 'EPERM' || code === 'EROFS' ? `cannot be written (${code})` : `cannot be used (${codeOrMessage(err)})`;
    throw new UsageError(`--out '${dir}' ${why}: name a folder you may write`);
  }
}

/** The signals that stop a run of generate (Ctrl-C, kill, a closed terminal): see intoOut. */
const STOPPING_SIGNALS: readonly NodeJS.Signals[] = ['SIGINT', 'SIGTERM', 'SIGHUP'];

/**
 * Runs `write` into the output folder (prepareOut), which pushes each file it writes to `written`. A run
 * that ends with no file, failed or stopped by a signal, takes back the folders made for it: each try
 * with a new --out left an empty one behind. Only while still empty (rmdir): a file put there
 * meanwhile keeps its folder.
 */
async function intoOut(dir: string, write: (written: string[]) => Promise<void>): Promise<string[]> {
  const made = await prepareOut(dir);
  const written: string[] = [];
  const takeBack = () => {
    if (written.length > 0) return;
    for (const folder of [...made].reverse()) {
      try {
        rmdirSync(folder);
      } catch {
        return;
      }
    }
  };
  const stopped = (signal: NodeJS.Signals) => {
    takeBack();
    stopListening();
    // Ended by the signal, as it would have been without this listener: the exit status says which.
    process.kill(process.pid, signal);
  };
  const stopListening = () => {
    for (const signal of STOPPING_SIGNALS) process.off(signal, stopped);
  };
  for (const signal of STOPPING_SIGNALS) process.once(signal, stopped);
  try {
    await write(written);
    return written;
  } catch (err) {
    takeBack();
    throw err;
  } finally {
    stopListening();
  }
}

/**
 * A model folder given where --model takes an id (`models verify` takes the folder itself): refused
 * with how to run it, where the registry's answer would call a folder that is there one that does not exist.
 */
async function refuseFolder(model: string): Promise<void> {
  const isFolder = await stat(model).then((s) => s.isDirectory(), () => false);
  if (!isFolder) return;
  const dir = path.resolve(model);
  throw new UsageError(
    `--model '${model}' is a folder, and --model takes a model's id: run it where it is with --models-dir ${shellWord(path.dirname(dir))} --model ${path.basename(dir)}, or install it with 'imagegen models import ${shellWord(model)}'`,
  );
}

/** Writes `<stem>.<ext>`, or `<stem>-2.<ext>`, `-3`... when taken: an earlier picture of the same prompt and seed (other steps, another model) is never overwritten. */
async function writeNew(dir: string, stem: string, extension: string, data: Uint8Array): Promise<string> {
  for (let copy = 1; ; copy++) {
    const file = path.join(dir, `${stem}${copy > 1 ? `-${copy}` : ''}.${extension}`);
    try {
      await writeFile(file, data, { flag: 'wx' });
      return file;
    } catch (err) {
      const { code } = err as NodeJS.ErrnoException;
      if (code === 'EEXIST') continue;
      // The file is ours ('wx' made it): a picture broken off by a full disk is not left to pass for one.
      await rm(file, { force: true });
      throw new Error(`cannot write ${file}: ${whyUnwritten(err as NodeJS.ErrnoException)}`);
    }
  }
}

/** Why a picture could not be written, with what to do: a full disk or spent quota, no permission, a read-only disk. */
function whyUnwritten(err: NodeJS.ErrnoException): string {
  if (isDiskFull(err)) return `the disk is full (${err.code}): free some space or name another --out`;
  return fileProblem(err) ?? messageOf(err);
}

/**
 * "A red circle, big!" -> "a-red-circle-big", for file names: its first 40 characters, cut between
 * characters (a UTF-16 cut could halve a letter beyond the BMP, which a file name cannot hold) and
 * trimmed after the cut, which may end on a dash that the seed's own would double.
 */
function slug(prompt: string): string {
  const words = prompt.toLowerCase().replace(/[^\p{L}\p{N}]+/gu, '-');
  return [...words.replace(/^-/, '')].slice(0, 40).join('').replace(/-$/, '') || 'image';
}

async function generateCommand(prompt: string, flags: GenerateFlags): Promise<string[]> {
  const config = loadModelSettings({ modelsDir: flags.modelsDir });
  // Loaded here, not at the top: --help, and every other command, start without the request's schemas, the registry and the tokenizers.
  const [{ parseGenerationRequest }, { ModelRegistry, modelRoots, NO_MODELS_DIR }, { planBatches }, { unresolvedModel }, { pino }] = await Promise.all([
    import('../api/wire.js'),
    import('../models/registry.js'),
    import('../service/plan.js'),
    import('../service/unresolved-model.js'),
    import('pino'),
  ]);
  const request = parseGenerationRequest({
    model: flags.model ?? config.defaultModel,
    prompt,
    n: numberFlag('--n', flags.n),
    size: flags.size,
    seed: numberFlag('--seed', flags.seed),
    steps: numberFlag('--steps', flags.steps),
    guidance_scale: numberFlag('--guidance-scale', flags.guidanceScale),
    negative_prompt: flags.negativePrompt,
    scheduler: flags.scheduler,
    rng: flags.rng,
    quality: flags.quality,
    style: flags.style,
    output_format: flags.format,
    response_format: 'b64_json',
  });
  // The registry's warnings (a broken folder beside the model) as plain lines, not JSON; those of its
  // scan held until the model is resolved, so that a model's own folder's problem is said once: the
  // error of a model that cannot run names it, and a warning printed before it said the same.
  type Warning = { msg: string; dir?: string };
  const warn = ({ msg, dir }: Warning) => process.stderr.write(`imagegen generate: warning: ${dir ? `${dir}: ` : ''}${msg}\n`);
  const scanned: Warning[] = [];
  let holding = true;
  const registry = new ModelRegistry({
    roots: modelRoots(config.modelsDir, EMBEDDED_MODELS_DIR),
    aliases: config.modelAliases,
    logger: pino(
      { level: 'warn' },
      {
        write(line: string) {
          const warning = JSON.parse(line) as Warning;
          if (holding) scanned.push(warning);
          else warn(warning);
        },
      },
    ),
  });
  await registry.scan();
  const model = await registry.resolve(request.model);
  const named = registry.aliasTarget(request.model) ?? request.model;
  holding = false;
  for (const warning of scanned) if (model || warning.dir === undefined || path.basename(warning.dir) !== named) warn(warning);
  if (!model) {
    await refuseFolder(request.model);
    // What the API answers, less the server: an alias, DEFAULT_MODEL, a folder installed but unusable and why.
    const { message, unusable } = unresolvedModel(request.model, registry, config.defaultModel, 'command');
    const install = "with 'imagegen models pull' or 'imagegen models import'";
    const advice = registry.searchesModelsDir()
      ? `Install one ${install}.`
      : `${NO_MODELS_DIR}: pass --models-dir (or set MODELS_DIR to) the folder a model was installed in, or install one ${install} and --models-dir.`;
    throw new Error(unusable ? message : `${message} ${advice}`);
  }
  const batches = planBatches(request, model, config.rng);
  return intoOut(flags.out, async (written) => {
    // Loaded once a picture is to be made: a usage error or a refused request answers without onnxruntime's modules.
    const { commandRuntime } = await import('./command-runtime.js');
    const stepsPerBatch = batches[0].steps;
    const progress = new Progress(process.stderr, `${model.id} ${batches[0].width}x${batches[0].height}`, batches.length * stepsPerBatch, 0, STEPS);
    const { runtime, keepFigures } = await commandRuntime(config, (message) => progress.note(`imagegen generate: ${message}`));
    const fileStem = slug(prompt);
    const { extension } = IMAGE_FORMATS[request.output_format];
    for (const [index, batch] of batches.entries()) {
      const onStep = progress.loop(stepsPerBatch);
      const images = await runtime.runBatch(batch, { onEvent: (event) => event.type === 'step' && onStep(event.step, event.total) });
      // What a size not run before took: the next command (or server) plans it from the figures, as this one could not.
      keepFigures(batch.modelDir);
      for (const image of images) {
        const file = await writeNew(flags.out, `${fileStem}-${image.seed}`, extension, image.data).catch((err: Error) => {
          throw new Error(`${err.message}${written.length ? `; written before it: ${written.join(', ')}` : ''}`);
        });
        written.push(file);
      }
      progress.note(`batch ${index + 1}/${batches.length} done`);
    }
    progress.finish();
    registry.close();
  });
}

export function registerGenerateCommand(program: Command): void {
  program
    .command('generate')
    .description('generate images in this process, without a server (the flags are the API request fields)')
    .argument('<prompt>', 'what to draw')
    .option('--model <id>', 'model id or alias [default: DEFAULT_MODEL]')
    .option('--size <WxH>', "image size [default: the model's]")
    .option('--n <count>', 'number of images, 1..10', '1')
    .option('--seed <seed>', 'seed of the first image (image i gets seed + i); -1 for a random one, as A1111 and ComfyUI take it [default: random]')
    .option('--steps <count>', 'denoising steps [default: from --quality]')
    .option('--guidance-scale <scale>', 'classifier-free guidance [default: from --style]')
    .option('--negative-prompt <text>', 'what not to draw')
    .option('--scheduler <name>', "sampler, e.g. euler, euler_a, dpmpp_2m_karras [default: the model's]")
    .option('--rng <generator>', 'noise generator: native, or torch for the pictures diffusers makes from a seed [RNG]')
    .option('--quality <quality>', 'the steps of the model preset: low; standard, medium or auto; hd, high, xhigh or max [default: standard]')
    .option('--style <style>', 'vivid or natural')
    .option('--format <format>', 'png, jpeg or webp', 'png')
    .option('--out <dir>', 'folder to write the images to', pathArgument, '.')
    .option('--models-dir <dir>', 'installed models [MODELS_DIR]')
    .action(async (prompt: string, flags: GenerateFlags) => {
      try {
        for (const file of await generateCommand(prompt, flags)) console.log(file);
      } catch (err) {
        // A flag the request schema refuses names the flag; what failed later (a model, a file) exits 1.
        const message = err instanceof ApiError && err.param ? `${flagOf(err.param)}: ${err.message}` : messageOf(err);
        console.error(`imagegen generate: ${message}`);
        process.exitCode = exitStatusOf(err);
      }
    });
}
