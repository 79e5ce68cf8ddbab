import { mkdir, readdir, rename, rm } from 'node:fs/promises';
import path from 'node:path';
import { defaultRuntime } from '../runtime/providers.js';
import type { ModelLayout } from '../models/layout.js';
import { exists, makeFolder } from '../util/files.js';
import { inspectModelFolder, OVERRIDE_FILE } from '../models/model-folder.js';
import { modelFolderAsRoot } from '../models/registry.js';
import { keepAfterExit, lastWritten, removeIfInterrupted, type Disk } from './disk.js';
import { ModelInstallError, ModelUsageError } from './errors.js';
import { lockHolder, ownedName, ownerOfName, ownerRuns, takeLock, type Lock } from './owner.js';
import type { ProgressOutput } from '../util/progress.js';
import { messageOf } from '../util/error-message.js';

/**
 * The models folder: model ids, the staging area, and putting models in place. Models are assembled in
 * `<models-dir>/.staging/` (the registry skips dot-folders; same file system, so a rename moves them)
 * and renamed to `<models-dir>/<id>` only once complete and validated, so the server never sees half
 * a model.
 */

/** What every models command takes. */
export interface CommandOptions {
  /** The folder of installed models (MODELS_DIR). */
  modelsDir: string;
  /** Where writes go; tests pass one that fails. */
  disk?: Disk;
  /** Progress and notes (stderr in the CLI). */
  output?: ProgressOutput;
}

export interface InstalledModel {
  id: string;
  dir: string;
  family: ModelLayout['family'];
  variant: ModelLayout['variant'];
  bytes: number;
}

const STAGING = '.staging';
const PULL_PREFIX = 'pull-';
const MODEL_ID = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;
/** Far below a file name's 255 bytes, which the staging folder's name (the id with a prefix, its owning process and host, and a UUID) must also fit in. */
const MAX_MODEL_ID_LENGTH = 128;

/** An id is a folder name in the models folder and the model name in API requests. */
export function checkModelId(id: string, advice = ''): void {
  if (!MODEL_ID.test(id) || id.includes('..') || id.length > MAX_MODEL_ID_LENGTH) {
    const shown = id.length > MAX_MODEL_ID_LENGTH ? `${id.slice(0, 40)}…' (${id.length} characters)` : `${id}'`;
    throw new ModelUsageError(
      `'${shown} is not a valid model id: use up to ${MAX_MODEL_ID_LENGTH} letters, digits, '.', '_' and '-', starting with a letter or digit (no path separators or '..')${advice ? `; ${advice}` : ''}`,
    );
  }
}

/**
 * An id naming an installed model (export, remove): any folder the server serves (models/registry.ts
 * serves every folder not starting with '.'), a name copied in by hand ("SD 1.5") included, which
 * checkModelId would refuse for a new install. Only what is no single folder's name is refused.
 */
export function checkInstalledId(id: string): void {
  if (id === '' || id.startsWith('.') || /[\\/\0]/.test(id)) {
    throw new ModelUsageError(`'${id}' is not a valid model id: give the name of a model's folder in the models folder, as "imagegen models list" shows it`);
  }
}

export const modelPath = (modelsDir: string, id: string) => path.join(modelsDir, id);

/** Where a pull keeps its files until complete; a stable name, so a later pull can resume. */
export const pullStagingPath = (modelsDir: string, id: string) => path.join(modelsDir, STAGING, `${PULL_PREFIX}${id}`);

/** The lock a running pull of `id` holds; not named `pull-...`, which unfinishedPulls would list. */
const pullLockPath = (modelsDir: string, id: string) => path.join(modelsDir, STAGING, `lock-${id}`);

/**
 * A process of another host or container always counts as running (owner.ts), as may one whose pid a new
 * process got: the lock's file is named, so that a lock whose pull is gone is not in the way forever.
 */
const pullRunning = (modelsDir: string, id: string, owner: string) =>
  `another "imagegen models pull" of '${id}' is running (process ${owner}; if it no longer runs there, delete ${pullLockPath(modelsDir, id)})`;

/**
 * Claims the pull of `id` for this process: two pulls of one id would write the same partial files (one
 * appending to a file the other is still writing) and delete each other's downloads. A lock left by a
 * pull that was killed is taken over, so the next run resumes its download.
 */
export async function lockPull(modelsDir: string, id: string): Promise<Lock> {
  await cleanStagingRoot(modelsDir);
  const taken = await takeLock(pullLockPath(modelsDir, id));
  if ('heldBy' in taken) throw new ModelInstallError(`${pullRunning(modelsDir, id, taken.heldBy)}; wait for it to finish, or stop it and run this command again to resume its download`);
  return taken;
}

/** Ids of pulls that stopped before finishing (their files wait in the staging area). */
export async function unfinishedPulls(modelsDir: string): Promise<string[]> {
  const names = await readdir(path.join(modelsDir, STAGING)).catch(() => []);
  return names.filter((name) => name.startsWith(PULL_PREFIX)).map((name) => name.slice(PULL_PREFIX.length));
}

const alreadyExists = (modelsDir: string, id: string) =>
  new ModelInstallError(`a model '${id}' already exists in ${modelsDir}; pass --force to replace it, or --name to install under another id`);

/**
 * A models folder that is a model's own folder (--models-dir given an export), refused before any work:
 * neither the server nor `models list` reads its parts as models, so an install would land where no one
 * finds it, and a removal would delete one of the model's parts. `nothing` says what was not done.
 */
async function refuseModelFolder(modelsDir: string, nothing: string): Promise<void> {
  const misplaced = await modelFolderAsRoot(modelsDir);
  if (misplaced) throw new ModelInstallError(`${misplaced}. ${nothing}`);
}

/** Checked before any work, so nothing is downloaded or copied for an install that cannot happen. */
export async function refuseExisting(modelsDir: string, id: string, force: boolean): Promise<void> {
  await refuseModelFolder(modelsDir, 'Nothing was installed');
  if (!force && (await exists(modelPath(modelsDir, id)))) throw alreadyExists(modelsDir, id);
}

/**
 * A staging folder of a version before staging names carried their owner (4647b2f): an import's half copy
 * (`import-<id>-` and mkdtemp's six characters, later a UUID), or a model moved aside to be replaced or
 * removed (`replaced-<id>-`, `removing-<id>-` and a UUID). One whose install was killed stayed for good,
 * as big as its model: this version, installed over it, must remove it too, or the README's promise that
 * the next install removes what a killed one left does not hold after an upgrade.
 */
const OWNERLESS_STAGING = /^(import|replaced|removing)-[^+]+-([A-Za-z0-9]{6}|[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12})$/;

/**
 * How long an ownerless staging folder must have gone unwritten to be taken for a killed install's: with no
 * owner to ask, only its age tells it from one that an older version, on another machine sharing the folder,
 * is running now. An install writes its folder throughout a copy; its load check, which writes nothing,
 * takes minutes for the largest models.
 */
const OWNERLESS_IDLE_MS = 60 * 60_000;

/** Whether `name` in the staging area `root` is what a killed install left (see OWNERLESS_STAGING). */
async function isAbandoned(root: string, name: string): Promise<boolean> {
  const owner = ownerOfName(name);
  if (owner !== undefined) return !ownerRuns(owner);
  return OWNERLESS_STAGING.test(name) && Date.now() - (await lastWritten(path.join(root, name))) > OWNERLESS_IDLE_MS;
}

/** The label of a model moved aside to be replaced (installStaged), before its id. */
const REPLACED = 'replaced-';

/**
 * The id of the model that `name`, a model moved aside by a replace (installStaged) that was killed, is
 * to be put back as: the replace was killed between its two renames (Ctrl-C while the second ran, kill -9,
 * a power cut), so the id names no model, and this is the only copy of the one it named.
 */
async function toPutBack(root: string, name: string): Promise<string | undefined> {
  if (!name.startsWith(REPLACED) || ownerOfName(name) === undefined) return undefined;
  const id = name.slice(REPLACED.length, name.indexOf('+'));
  return (await exists(modelPath(path.dirname(root), id))) ? undefined : id;
}

/**
 * Removes the staging folders and lock drafts that killed installs left; a pull's download (kept to
 * resume) has no owner in its name. A model a killed replace moved aside is put back where its id names
 * nothing: deleted, the model was gone, the id naming neither the old model nor the new.
 */
async function removeAbandoned(root: string): Promise<void> {
  for (const name of await readdir(root)) {
    if (!(await isAbandoned(root, name))) continue;
    const id = await toPutBack(root, name);
    if (id === undefined) await rm(path.join(root, name), { recursive: true, force: true });
    else {
      await rename(path.join(root, name), modelPath(path.dirname(root), id)).catch((err: NodeJS.ErrnoException) => {
        // Installed meanwhile by another command: the next cleanup deletes this copy, the id naming a model again.
        if (err.code !== 'ENOTEMPTY' && err.code !== 'EEXIST') throw err;
      });
    }
  }
}

/** The staging area, made if missing. */
async function stagingRoot(modelsDir: string): Promise<string> {
  const root = path.join(modelsDir, STAGING);
  await makeFolder(root);
  return root;
}

/**
 * The staging area, made if missing and rid of what killed installs left. Each command does this once,
 * as it starts (lockPull, makeTemporary, removeModel): listing it again for a model moved aside later
 * in the same install would find nothing new to remove.
 */
async function cleanStagingRoot(modelsDir: string): Promise<string> {
  const root = await stagingRoot(modelsDir);
  await removeAbandoned(root);
  return root;
}

/**
 * A new folder in the staging area; removed on failure by the caller, and on Ctrl-C by the exit hook.
 * Made with mkdir, not mkdtemp: mkdtemp's folders are 0700 whatever the umask, and the model renamed
 * into place from one could not be read by a server running as another user than the installer.
 */
export async function makeTemporary(modelsDir: string, prefix: string): Promise<string> {
  const dir = path.join(await cleanStagingRoot(modelsDir), ownedName(prefix));
  await mkdir(dir);
  removeIfInterrupted(dir);
  return dir;
}

/** A free path in the staging area `root` to move a model folder aside to. */
const asidePath = (root: string, label: string) => path.join(root, ownedName(label));

export async function removeTemporary(dir: string): Promise<void> {
  await rm(dir, { recursive: true, force: true });
  keepAfterExit(dir);
}

export interface ValidateOptions {
  /** Also load every ONNX session (slow and memory-hungry for big models, but catches damaged files). */
  load: boolean;
  /** How to name the model in messages instead of its staging path. */
  label: string;
  /** What to do when it is unusable. */
  advice: string;
  /**
   * What to say instead of `advice` after a reason that says what to do itself (FolderVerdict's
   * saysWhatToDo): an import's advice, to copy the export again, would repeat a damaged file's. `advice` when not given.
   */
  adviceAfterRemedy?: string;
  /** What a refusal for the folder's imagegen.json says was not done: 'Nothing was installed' unless given ('Nothing was exported'). */
  undone?: string;
  /** Told that the load check runs: a big model's sessions take a minute or more to load, after the copy's progress has ended. */
  output?: ProgressOutput;
}

/** Messages about `dir` name the model as the user knows it (`label`), not by its staging path. */
function refusal(dir: string, label: string, message: string, advice: string): ModelInstallError {
  return new ModelInstallError(`${message.replaceAll(path.resolve(dir), label).replace(/\.+$/, '')}. ${advice}`);
}

/**
 * Refuses a folder the server would not use, by the verdict the server itself gives
 * (inspectModelFolder), with `advice`; its layout otherwise. Reads no weights: an import runs it on the
 * source folder before copying, so an incomplete export is refused in a moment rather than after a
 * copy of gigabytes.
 */
export async function checkLayout(dir: string, options: Pick<ValidateOptions, 'label' | 'advice' | 'adviceAfterRemedy' | 'undone'>): Promise<ModelLayout> {
  const verdict = await inspectModelFolder(dir);
  if (verdict.usable) return verdict.layout;
  // Our own preset file is a text the user wrote, not a damaged export: copying again would not help.
  const presetAdvice = `${options.undone ?? 'Nothing was installed'}. Correct ${OVERRIDE_FILE} in ${options.label} (its fields: docs/api.md, "What quality and style do"), or remove it to use the family's defaults, then try again`;
  // A reason that says what to do itself (a damaged file, one it may not read) is not followed by other advice.
  const ownAdvice = (verdict.saysWhatToDo && options.adviceAfterRemedy) || options.advice;
  const advice = verdict.reason.startsWith(`${OVERRIDE_FILE}:`) ? presetAdvice : ownAdvice;
  throw refusal(dir, options.label, `${options.label} is not a usable model folder: ${verdict.reason}`, advice);
}

/** Checks that the server will use the model in `dir` (checkLayout), and (`load`) that its ONNX files load. */
export async function validateModel(dir: string, options: ValidateOptions): Promise<ModelLayout> {
  const layout = await checkLayout(dir, options);
  if (options.load) {
    options.output?.write(`checking that ${options.label} loads (its ONNX sessions; --skip-load skips this)\n`);
    try {
      // Loaded here, not at the top: the commands that load no model (models list, remove) start without onnxruntime, sharp and the pipelines.
      const { loadPipeline } = await import('../pipelines/load.js');
      const pipeline = await loadPipeline(dir, { ...defaultRuntime(), warn: () => undefined });
      await pipeline.release();
    } catch (err) {
      // Whatever fails here (ONNX parsing, tokenizer files) is a problem of the model's files.
      throw refusal(dir, options.label, messageOf(err), options.advice);
    }
  }
  return layout;
}

/**
 * Renames the validated folder `staged` to `<models-dir>/<id>`. Replacing (`force`) moves the old model
 * aside and deletes it only once the new one is in place, so the id never names a partial model (for
 * the moment between the two renames it names none; a directory cannot be swapped in one rename).
 */
export async function installStaged(staged: string, modelsDir: string, id: string, force: boolean): Promise<string> {
  const target = modelPath(modelsDir, id);
  if (!(await exists(target))) {
    await rename(staged, target).catch((err: NodeJS.ErrnoException) => {
      throw err.code === 'ENOTEMPTY' || err.code === 'EEXIST' ? alreadyExists(modelsDir, id) : err;
    });
    return target;
  }
  if (!force) throw alreadyExists(modelsDir, id);
  // The install that staged the model cleaned the staging area as it started (lockPull, makeTemporary).
  const old = asidePath(await stagingRoot(modelsDir), `${REPLACED}${id}`);
  await rename(target, old);
  try {
    await rename(staged, target);
  } catch (err) {
    await rename(old, target);
    throw err;
  }
  await rm(old, { recursive: true, force: true });
  return target;
}

export interface Removed {
  model: boolean;
  unfinishedPull: boolean;
}

/** Removes a model (moved out of sight first, so the server never scans a half-deleted folder) and any unfinished pull of it. */
export async function removeModel(modelsDir: string, id: string): Promise<Removed> {
  checkInstalledId(id);
  await refuseModelFolder(modelsDir, 'Nothing was removed');
  const target = modelPath(modelsDir, id);
  const partial = pullStagingPath(modelsDir, id);
  // Its download would be deleted under it, and the pull would install the model again anyway.
  const puller = await lockHolder(pullLockPath(modelsDir, id));
  if (puller) throw new ModelInstallError(`${pullRunning(modelsDir, id, puller)}; stop it first, then remove '${id}'`);
  const removed = { model: await exists(target), unfinishedPull: await exists(partial) };
  if (!removed.model && !removed.unfinishedPull) {
    throw new ModelInstallError(`there is no model '${id}' in ${modelsDir}; "imagegen models list" shows the installed ones`);
  }
  if (removed.model) {
    // A symbolic link is moved and deleted itself, not what it points to.
    const trash = asidePath(await cleanStagingRoot(modelsDir), `removing-${id}`);
    await rename(target, trash);
    await rm(trash, { recursive: true, force: true });
  }
  if (removed.unfinishedPull) await rm(partial, { recursive: true, force: true });
  return removed;
}
