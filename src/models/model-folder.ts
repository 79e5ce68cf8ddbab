import { lstat, stat } from 'node:fs/promises';
import path from 'node:path';
import type { Capability, FamilyEntry } from '../families/family.js';
import { familyEntry } from '../families/index.js';
import { refusalNote, schedulersRunning, type SchedulerOffer, type SchedulerRefusal } from '../schedulers/index.js';
import { describeIssues, readJsonIfPresent } from '../util/files.js';
import { inspectModel, ModelLayoutError, standInNote, withinFolder, type ModelLayout } from './layout.js';
import { presetFor, presetOverrideSchema, type ModelPreset } from './presets.js';
import { messageOf } from '../util/error-message.js';
import { printable } from '../util/printable.js';

/**
 * The one verdict on a model folder: can the server run it, and if not, why. The registry (and with
 * it the log and /ready), `imagegen models list` and installs all ask this, so a folder that one of
 * them accepts is never skipped by another, and each says the same reason in the same words.
 */

export interface UsableModel {
  usable: true;
  layout: ModelLayout;
  preset: ModelPreset;
  /** Scheduler names a request may choose for this model. */
  schedulers: string[];
  /** Its kind's other schedulers, which refuse its scheduler config, with why: said by the scan's log, `models list` and a request naming one. */
  refusedSchedulers: SchedulerRefusal[];
  /** What it can do: its family's capabilities that its export has the components for. */
  capabilities: Capability[];
}

export interface UnusableModel {
  usable: false;
  /** What is wrong and what to do, without the folder's path (callers name the model their own way). */
  reason: string;
  /**
   * Whether `reason` itself says what to do (a damaged file: copy it again from the export; a link to
   * nothing: remove it), so that an install adds only that nothing was installed rather than its own
   * advice, which said the same again or did not fit.
   */
  saysWhatToDo: boolean;
}

export type FolderVerdict = UsableModel | UnusableModel;

/** The per-model preset overrides; see presets.ts. A verdict about it starts with its name. */
export const OVERRIDE_FILE = 'imagegen.json';

/**
 * The operator's imagegen.json, or undefined where there is none. A file that is no JSON (a comma or a
 * comment a hand edit added, a file saved as UTF-16) is said as a problem of imagegen.json, as its
 * other problems are: said as any file's, `models export` sent its operator to pull or import the model
 * again, which would not have brought their file back, rather than to correct it.
 */
async function presetFileOf(dir: string): Promise<unknown> {
  const file = path.join(dir, OVERRIDE_FILE);
  return readJsonIfPresent(file).catch((err: NodeJS.ErrnoException) => {
    // A file it may not read is the folder's permissions' problem (see unreadable).
    if (err.code !== undefined) throw err;
    throw new Error(`${OVERRIDE_FILE}: ${messageOf(err).replace(`${file} is `, '')}`);
  });
}

async function presetOf(dir: string, layout: ModelLayout, schedulers: SchedulerOffer): Promise<ModelPreset> {
  const parsed = presetOverrideSchema.safeParse((await presetFileOf(dir)) ?? {});
  if (!parsed.success) throw new Error(`${OVERRIDE_FILE}: ${describeIssues(parsed.error)}`);
  try {
    return presetFor(layout, parsed.data, schedulers);
  } catch (err) {
    throw new Error(`${OVERRIDE_FILE}: ${messageOf(err)}`);
  }
}

/** Editing a picture starts from its latents: an export without the VAE encoder cannot. */
const NEEDS_VAE_ENCODER: ReadonlySet<Capability> = new Set(['image-to-image', 'inpainting']);

function capabilitiesOf(family: FamilyEntry, layout: ModelLayout): Capability[] {
  return family.capabilities.filter((capability) => layout.vaeEncoder || !NEEDS_VAE_ENCODER.has(capability));
}

/** Why `dir` is no folder to look into, if it is not: a link to nothing (or round in a circle), or to a file. */
async function notAFolder(dir: string): Promise<string | undefined> {
  const info = await stat(dir).catch((err: NodeJS.ErrnoException) => err);
  if (!(info instanceof Error)) return info.isDirectory() ? undefined : 'a link to a file, not to a model folder: remove it or point it at a model folder';
  // Nothing there at all: inspectModel says the folder does not exist.
  if (info.code === 'ENOENT' && !(await lstat(dir).catch(() => undefined))) return undefined;
  return `a symbolic link to nothing that can be read (${info.code}): remove it or point it at a model folder`;
}

/**
 * The verdict on the folder `dir`. A reason quotes the folder's own files (a class name, an imagegen.json
 * key), which a repository's publisher wrote: it reaches `imagegen models list` and installs' terminals
 * printable (util/printable.ts), as the notes of notesOf do.
 */
export async function inspectModelFolder(dir: string): Promise<FolderVerdict> {
  const verdict = await folderVerdict(dir);
  return verdict.usable ? verdict : { ...verdict, reason: printable(verdict.reason) };
}

async function folderVerdict(dir: string): Promise<FolderVerdict> {
  const problem = await notAFolder(dir);
  if (problem) return { usable: false, reason: problem, saysWhatToDo: true };
  try {
    const layout = await inspectModel(dir);
    const family = familyEntry(layout.family);
    const schedulers = schedulersRunning(layout.scheduler, family.schedulerKind);
    const preset = await presetOf(dir, layout, schedulers);
    return { usable: true, layout, preset, schedulers: schedulers.running, refusedSchedulers: schedulers.refused, capabilities: capabilitiesOf(family, layout) };
  } catch (err) {
    // Any failure, an unreadable file included, makes the folder unusable; the server must go on serving the others.
    if (err instanceof ModelLayoutError) return { usable: false, reason: err.problem, saysWhatToDo: err.saysWhatToDo };
    const denied = unreadable(dir, err as NodeJS.ErrnoException);
    return { usable: false, reason: denied ?? withinFolder(dir, messageOf(err)), saysWhatToDo: denied !== undefined };
  }
}

/** Why a file of `dir` could not be read for want of permission, in words that say what to do, or undefined for any other error. */
function unreadable(dir: string, err: NodeJS.ErrnoException): string | undefined {
  if ((err.code !== 'EACCES' && err.code !== 'EPERM') || err.path === undefined) return undefined;
  return `no permission to read ${path.relative(dir, err.path)} (${err.code}): let the user running imagegen read every file of the model (chmod -R a+rX on its folder, or chown)`;
}

/**
 * What an operator is told of a usable model, in the same words by the scan's log and `models list`:
 * the scheduler standing in for a class this server does not run, and the schedulers it does not offer.
 */
export function notesOf(model: Pick<UsableModel, 'layout' | 'refusedSchedulers'>): string[] {
  const standIn = model.layout.schedulerStandIn;
  return [standIn && standInNote(standIn), refusalNote(model.refusedSchedulers)].filter((note) => note !== undefined).map(printable);
}
