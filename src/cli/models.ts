import { formatBytes } from '../util/bytes.js';
import { existsSync } from 'node:fs';
import { stat } from 'node:fs/promises';
import path from 'node:path';
import { Command, InvalidArgumentError, Option } from 'commander';
import { EMBEDDED_MODELS_DIR, envName, settingDefault, settingText, type SettingName } from '../config.js';
import { OPENAI_MODEL_NAMES } from '../api/dialects.js';
import { ModelInstallError, ModelUsageError } from '../install/errors.js';
import { DEFAULT_HUB_URL, MANIFEST_FILE } from '../install/constants.js';
import type { InstalledModel } from '../install/index.js';
import type { ModelMemory } from '../models/memory-figures.js';
import { EXECUTION_PROVIDERS, GRAPH_REWRITE_SETS, type ExecutionProvider, type GraphRewrites } from '../runtime/providers.js';
import { registerVerifyCommand } from './verify.js';
import { exitStatusOf } from './exit-status.js';
import { messageOf } from '../util/error-message.js';
import { fileProblem } from './file-problem.js';
import { pathArgument, refuseUnexpandedHome } from './path-argument.js';
import { shellWord } from '../util/shell-word.js';
import { printable } from '../util/printable.js';

/**
 * `imagegen models ...`: manage the models folder the server reads (MODELS_DIR). The work is done by
 * src/install/; this file maps flags to it and prints results. Failures print their message
 * (which says what to do) and set exit code 2 for an argument refused before any work, 1 for work
 * that failed.
 */

const MODELS_DIR = envName('modelsDir');
const DATA_DIR = envName('dataDir');

/**
 * The installer, loaded by the models command that runs, not at the top: --help and the other commands
 * start without it (the Hub's client, the model families, the tokenizers' files).
 */
const installer = () => import('../install/index.js');

interface CommonFlags {
  modelsDir?: string;
}

function modelsDirOf(flags: CommonFlags): string {
  if (!flags.modelsDir) throw new ModelUsageError(`no models folder given: pass --models-dir <dir> or set ${MODELS_DIR} (the same folder the server reads models from)`);
  return flags.modelsDir;
}

/** Runs an action, reporting install failures and system errors (EACCES...) as a message rather than a stack trace. */
function reporting<A extends unknown[]>(action: (...args: A) => Promise<void>): (...args: A) => Promise<void> {
  return async (...args) => {
    try {
      await action(...args);
    } catch (err) {
      if (!(err instanceof ModelInstallError) && !(err as NodeJS.ErrnoException).syscall) throw err;
      // Clears a progress bar left half-drawn on a terminal.
      if (process.stderr.isTTY) process.stderr.write('\r\x1b[K');
      const systemError = err instanceof ModelInstallError ? undefined : fileProblem(err as NodeJS.ErrnoException);
      // Printable: a refusal quotes names others wrote (a folder's, a bundle's entries, a repository's files).
      console.error(`error: ${printable(systemError ?? messageOf(err))}`);
      process.exitCode = exitStatusOf(err);
    }
  };
}

/** Ctrl-C exits through process.exit, so the 'exit' hook removes half-copied staging folders. */
function exitOnInterrupt(message: string): void {
  const stop = () => {
    console.error(`\n${message}`);
    process.exit(130);
  };
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
}

function printInstalled(model: InstalledModel): void {
  console.log(`installed ${model.id} (${model.family}, ${model.variant}, ${formatBytes(model.bytes)}) in ${model.dir}`);
  // Only a server reading this folder sees it: one started without MODELS_DIR (as the README's first run is) never will.
  // Absolute: a --models-dir given relative names another folder for a server started elsewhere (a service's).
  console.log(
    `a server with ${MODELS_DIR}=${shellWord(path.resolve(path.dirname(model.dir)))} picks it up (or the new version of a model it replaced) with its next request, or at its next rescan (${envName('modelsRescanSeconds')}): "model": "${model.id}", or ${envName('defaultModel')}=${model.id} for requests that name none`,
  );
  // Legitimate (a model meant to answer for that name), but it changes what other requests run.
  if ((OPENAI_MODEL_NAMES as readonly string[]).includes(model.id)) {
    console.log(`note: ${model.id} is also an OpenAI model name: requests naming it now run this model, not the one ${envName('modelAliases')} or ${envName('defaultModel')} gives it`);
  }
  if (existsSync(path.join(EMBEDDED_MODELS_DIR, model.id))) {
    console.log(`note: ${model.id} is also the id of a model that comes with the server: requests naming it (and ${envName('defaultModel')}=${model.id}) now run this one`);
  }
}

/** "1.2 GiB + 3.4 GiB at 1.0 MP": loaded, and the most one batch took on top (at that many samples x pixels of one denoiser call; see Pipeline.samplesPerImage). */
function describeMemory(memory: ModelMemory | undefined): string {
  if (!memory) return 'not measured';
  const peak = memory.peakPixels ? ` + ${formatBytes(memory.peakBytes)} at ${(memory.peakPixels / 2 ** 20).toFixed(1)} MP` : '';
  return `${formatBytes(memory.weightsBytes)}${peak}`;
}

/** `models list`: a table of the folder's models, their status and measured memory. */
async function printModelList(flags: CommonFlags & { dataDir: string; executionProvider: ExecutionProvider; graphRewrites: GraphRewrites }): Promise<void> {
  const modelsDir = modelsDirOf(flags);
  // A mistyped folder is not an empty one: say so, rather than "no models".
  const folder = await stat(modelsDir).catch((err: NodeJS.ErrnoException) => err);
  if (folder instanceof Error || !folder.isDirectory()) {
    const installs = folder instanceof Error ? '; `models import` and `models pull` create it as they install the first model' : '';
    throw new ModelInstallError(
      `${modelsDir} is ${folder instanceof Error ? `not there (${folder.code})` : 'a file, not a folder'}: pass the folder the server reads models from (--models-dir or ${MODELS_DIR})${installs}`,
    );
  }
  const [{ listModels }, { folderVersion, modelFolderAsRoot }, { figuresFor, readMemoryFigures }] = await Promise.all([
    installer(),
    import('../models/registry.js'),
    import('../models/memory-figures.js'),
  ]);
  const misplaced = await modelFolderAsRoot(modelsDir);
  if (misplaced) throw new ModelInstallError(misplaced);
  const memory = await readMemoryFigures(flags.dataDir, flags.executionProvider, flags.graphRewrites);
  const rows: string[][] = [];
  for (const model of await listModels(modelsDir)) {
    const dir = path.resolve(modelsDir, model.id);
    // Figures of another model once installed under this id are not this one's (an unfinished pull has no
    // folder to tell by). Without figures there is nothing to tell, and no files to stat.
    const version = memory[dir] && (await folderVersion(dir).catch(() => undefined));
    rows.push([
      model.id,
      model.family ? `${model.family}/${model.variant}` : '-',
      formatBytes(model.bytes),
      describeMemory(figuresFor(memory[dir], version)),
      model.reason ? `${model.status}: ${model.reason}` : model.status,
    ]);
  }
  if (!rows.length) {
    console.log(`no models in ${modelsDir}; install one with "imagegen models pull <repo>" or "imagegen models import <folder|bundle>"`);
    return;
  }
  const table = [['ID', 'MODEL', 'SIZE', 'MEMORY', 'STATUS'], ...rows];
  const widths = table[0].map((_, column) => Math.max(...table.map((row) => row[column].length)));
  for (const row of table) console.log(row.map((cell, column) => (column < row.length - 1 ? cell.padEnd(widths[column]) : cell)).join('  '));
  // A mistyped data folder shows every model "not measured", as if none had run: said so.
  const dataDir = await stat(flags.dataDir).catch((err: NodeJS.ErrnoException) => err);
  if (dataDir instanceof Error && dataDir.code === 'ENOENT') {
    console.error(`note: ${path.resolve(flags.dataDir)} (--data-dir or ${DATA_DIR}) does not exist, so no measured memory was read: pass the server's data folder, if it has measured these models`);
  }
}

/**
 * A flag for one of the server's settings, read from its variable as `serve` reads it (settingText):
 * commander takes a variable set empty as a value (EXECUTION_PROVIDER= refused as no choice, DATA_DIR=
 * as the current folder) and keeps spaces around a path, where the server takes the setting's default
 * and the path. Unset, the setting's default; `choices` are checked after.
 */
function settingOption(flags: string, description: string, name: SettingName, choices?: readonly string[]): Option {
  const fallback = settingDefault(name);
  const option = new Option(flags, description).env(envName(name));
  if (fallback !== undefined) option.default(fallback);
  // Before argParser, which then replaces its check: choices stay for --help.
  if (choices) option.choices(choices);
  return option.argParser((text: string) => {
    const value = settingText(text) ?? fallback;
    // A folder's setting (--models-dir=~/models, or MODELS_DIR=~/models from an environment file), as the server's own check refuses it.
    if (value !== undefined) refuseUnexpandedHome(value);
    if (choices && !choices.includes(value ?? '')) throw new InvalidArgumentError(`Allowed choices are ${choices.join(', ')}.`);
    return value;
  });
}

const modelsDirOption = () => settingOption('--models-dir <dir>', 'folder of installed models, one sub-folder per model', 'modelsDir');
const forceOption = () => new Option('--force', 'replace an installed model of the same id (the old one stays until the new one is in place)');
const skipLoadOption = () =>
  new Option('--skip-load', 'do not load the ONNX files before installing (faster for big models; layout and checksums are still checked)');

export function registerModelCommands(program: Command): void {
  const models = program
    .command('models')
    .description(`install, list, export and remove models in the models folder (--models-dir or ${MODELS_DIR})`);

  models
    .command('pull')
    .description('download a diffusers ONNX export from the Hugging Face Hub (or a mirror), verify it and install it')
    .argument('<repo>', 'repository, owner/name or owner/name@revision (branch, tag or commit)')
    .option('--subfolder <path>', 'folder of the export inside the repository, e.g. onnx')
    .option('--name <id>', 'model id to install as (default: the repository name)')
    .addOption(new Option('--hub-url <url>', 'Hub or mirror address').env('HF_ENDPOINT').default(DEFAULT_HUB_URL))
    .addOption(forceOption())
    .addOption(skipLoadOption())
    .addOption(modelsDirOption())
    .addHelpText(
      'after',
      '\nSet HF_TOKEN for gated or private repositories; HF_HUB_OFFLINE=1 refuses every pull, as Hugging Face\'s own tools do. Only the ONNX export is downloaded (not PyTorch weights or pictures).\n' +
        'An interrupted pull keeps what it downloaded: run the same command again to resume.',
    )
    .action(
      reporting(async (repo: string, flags: CommonFlags & { subfolder?: string; name?: string; hubUrl: string; force?: boolean; skipLoad?: boolean }) => {
        const modelsDir = modelsDirOf(flags);
        exitOnInterrupt('interrupted: what was downloaded is kept; run the same command again to resume');
        const { pullModel } = await installer();
        printInstalled(
          await pullModel({
            modelsDir,
            repo,
            subfolder: flags.subfolder,
            name: flags.name,
            hubUrl: flags.hubUrl,
            token: process.env.HF_TOKEN || undefined,
            offline: process.env.HF_HUB_OFFLINE,
            force: flags.force,
            load: !flags.skipLoad,
          }),
        );
      }),
    );

  models
    .command('import')
    .description('install a model folder, or a bundle written by "models export", from local disk')
    .argument('<source>', 'model folder (e.g. a diffusers ONNX export) or bundle file (.tar)', pathArgument)
    .option('--name <id>', "model id to install as (default: the folder's name, or the bundle's model id)")
    .addOption(forceOption())
    .addOption(skipLoadOption())
    .addOption(modelsDirOption())
    .addHelpText('after', `\nWhen the source holds ${MANIFEST_FILE}, every file is checked against its size and sha256.`)
    .action(
      reporting(async (source: string, flags: CommonFlags & { name?: string; force?: boolean; skipLoad?: boolean }) => {
        const modelsDir = modelsDirOf(flags);
        exitOnInterrupt('interrupted: nothing was installed');
        const { importModel } = await installer();
        printInstalled(await importModel({ modelsDir, source, name: flags.name, force: flags.force, load: !flags.skipLoad }));
      }),
    );

  models
    .command('export')
    .description('write an installed model as a single-file bundle to carry to another machine, e.g. into an air-gapped site')
    .argument('<id>', 'installed model id')
    .requiredOption('--out <path>', 'bundle file to write, or an existing folder to write <id>.tar into', pathArgument)
    .addOption(modelsDirOption())
    .addHelpText(
      'after',
      `\nThe bundle is an uncompressed tar holding <id>/ with the model's files and ${MANIFEST_FILE} (size and sha256 of each file).\n` +
        'Install it with "imagegen models import <bundle>"; "tar xf" also unpacks it into a folder that import accepts.',
    )
    .action(
      reporting(async (id: string, flags: CommonFlags & { out: string }) => {
        const modelsDir = modelsDirOf(flags);
        exitOnInterrupt('interrupted: no bundle was written');
        const { exportModel } = await installer();
        const bundle = await exportModel({ modelsDir, id, out: flags.out });
        console.log(`wrote ${bundle.file} (${formatBytes(bundle.bytes)}); install it with: imagegen models import ${shellWord(bundle.file)}`);
      }),
    );

  models
    .command('list')
    .description('list installed models, whether the server can use them, what they measured in memory, and unfinished pulls')
    .addOption(modelsDirOption())
    // The server's own settings and defaults, so that the figures shown are those the server keeps.
    .addOption(settingOption('--data-dir <dir>', "the server's data folder, where it keeps the memory each model measured", 'dataDir'))
    .addOption(settingOption('--execution-provider <provider>', 'the provider whose memory figures to show (each keeps its own)', 'executionProvider', EXECUTION_PROVIDERS))
    .addOption(settingOption('--graph-rewrites <set>', 'the graph rewrites whose memory figures to show (each set keeps its own)', 'graphRewrites', GRAPH_REWRITE_SETS))
    .action(reporting(printModelList));

  registerVerifyCommand(models);

  models
    .command('remove')
    .description('remove an installed model (and any unfinished pull of it)')
    .argument('<id>', 'installed model id')
    .addOption(modelsDirOption())
    .action(
      reporting(async (id: string, flags: CommonFlags) => {
        const modelsDir = modelsDirOf(flags);
        const { removeModel } = await installer();
        const removed = await removeModel(modelsDir, id);
        console.log(`removed ${[removed.model ? `model ${id}` : '', removed.unfinishedPull ? `the unfinished pull of ${id}` : ''].filter(Boolean).join(' and ')}`);
      }),
    );
}
