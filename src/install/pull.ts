import { mkdir, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { z } from 'zod';
import { diskFullError, ensureFreeSpace, listFolder, realDisk } from './disk.js';
import { bytesPresent, downloadFiles } from './downloader.js';
import { DownloadInterrupted, ModelInstallError, ModelUsageError } from './errors.js';
import { HubClient, parseRepoRef, type HubClientOptions, type HubFile, type RepoRef } from './hub-client.js';
import { checkModelId, installStaged, lockPull, pullStagingPath, refuseExisting, validateModel, type CommandOptions, type InstalledModel } from './installer.js';
import { writeManifest } from './manifest.js';
import { checkHasExport, modelFilesOf, skippedNote } from './model-files.js';
import type { ProgressOutput } from '../util/progress.js';
import { describeIssues, isDiskFull, readJsonIfPresent } from '../util/files.js';
import { messageOf } from '../util/error-message.js';

/** `models pull`: a Hub repository's ONNX export, downloaded, verified and installed. */

export interface PullOptions extends CommandOptions, HubClientOptions {
  /** owner/name or owner/name@revision. */
  repo: string;
  /** The export's folder inside the repository, e.g. "onnx". */
  subfolder?: string;
  /** Model id; the repository's name by default. */
  name?: string;
  /** Replace an installed model of the same id. */
  force?: boolean;
  /** Load the ONNX sessions before installing (default true). */
  load?: boolean;
  /** Retries of a dropped connection before giving up (default 3). */
  retries?: number;
  retryDelayMs?: number;
}

/** What a pull in progress is fetching, kept next to its files so that the next run can resume. */
const pullStateSchema = z.object({
  repo: z.string(),
  subfolder: z.string(),
  /** Path -> the Hub's id of its content: parts of files that changed since are dropped. */
  files: z.record(z.string(), z.string()),
});
type PullState = z.infer<typeof pullStateSchema>;

const STATE_FILE = 'pull.json';

/** What one pull fetches: the export's files at the commit its revision names, installed as `id`. */
interface PullPlan {
  id: string;
  ref: RepoRef;
  subfolder: string;
  hub: HubClient;
  commit: string;
  files: HubFile[];
  /** The repository, revision and folder, as progress and messages name them. */
  label: string;
  /** Bytes of all the files. */
  total: number;
}

/** The staging folder of a pull, and the bytes an earlier run of it left there (resumed). */
interface Staged {
  staging: string;
  /** Where the model's files are downloaded: what gets installed. */
  dir: string;
  present: number;
}

/** PullOptions with their defaults filled in. */
type Pull = PullOptions & Required<Pick<PullOptions, 'disk' | 'output'>>;

const SPACE_ADVICE = 'Free up space, or use a --models-dir on a bigger disk, then pull again';

export async function pullModel(options: PullOptions): Promise<InstalledModel> {
  const pull: Pull = { ...options, disk: options.disk ?? realDisk, output: options.output ?? process.stderr };
  const plan = await planPull(pull);
  const lock = await lockPull(pull.modelsDir, plan.id).catch((err) => startFailed(err, pull.modelsDir));
  try {
    const staged = await stage(plan, pull);
    return await downloadAndInstall(plan, staged, pull);
  } finally {
    await lock.release();
  }
}

/** Checks the id is free and finds the export's files at the revision's commit, saying which files it leaves out. */
async function planPull(pull: Pull): Promise<PullPlan> {
  const ref = parseRepoRef(pull.repo);
  const subfolder = normaliseSubfolder(pull.subfolder);
  const id = pull.name ?? ref.repo.split('/').pop()!;
  checkModelId(id, 'choose one with --name');
  await refuseExisting(pull.modelsDir, id, pull.force ?? false);

  const hub = new HubClient(pull);
  const commit = await hub.resolveCommit(ref);
  const listed = await hub.listFiles(ref, commit, subfolder);
  const { files, skipped } = modelFilesOf(listed);
  checkHasExport(
    {
      where: `${ref.repo}@${ref.revision}${subfolder ? ` in '${subfolder}'` : ''}`,
      pick: (root) => `--subfolder ${subfolder ? `${subfolder}/` : ''}${root}`,
      otherwise: 'it may hold only PyTorch weights: choose a repository with an ONNX export (for example one converted with Optimum), or export one with "optimum-cli export onnx"',
    },
    files.map((file) => file.path),
    listed.map((file) => file.path),
  );
  const label = `${ref.repo}@${ref.revision}${subfolder ? ` (${subfolder}/)` : ''}`;
  if (skipped.length) pull.output.write(skippedNote(label, skipped));
  return { id, ref, subfolder, hub, commit, files, label, total: files.reduce((sum, file) => sum + file.size, 0) };
}

/** Readies the pull's staging folder (keeping what an earlier run of it downloaded) and checks the rest fits on the disk. */
async function stage(plan: PullPlan, pull: Pull): Promise<Staged> {
  const staging = pullStagingPath(pull.modelsDir, plan.id);
  const dir = path.join(staging, 'model');
  const state = { repo: plan.ref.repo, subfolder: plan.subfolder, files: Object.fromEntries(plan.files.map((file) => [file.path, contentId(file)])) };
  await prepareStaging(staging, state, pull.output).catch((err) => startFailed(err, pull.modelsDir));
  const present = await bytesPresent(dir, plan.files);
  await ensureFreeSpace(pull.disk, pull.modelsDir, plan.total - present, SPACE_ADVICE).catch(async (err) => {
    // What an earlier run downloaded stays for the pull after space was freed; an empty start does not.
    if (present === 0) await rm(staging, { recursive: true, force: true });
    throw err;
  });
  return { staging, dir, present };
}

/**
 * Downloads the files, records their digests, checks (and by default loads) the model and installs it.
 * An interrupted download keeps its staging folder for the next run to resume; any other failure
 * discards it.
 */
async function downloadAndInstall(plan: PullPlan, { staging, dir, present }: Staged, pull: Pull): Promise<InstalledModel> {
  const { id, ref, subfolder, commit, label, total } = plan;
  try {
    const digests = await downloadFiles({
      hub: plan.hub,
      ref,
      commit,
      files: plan.files,
      dir,
      present,
      disk: pull.disk,
      output: pull.output,
      retries: pull.retries ?? 3,
      retryDelayMs: pull.retryDelayMs ?? 1000,
      resumeAdvice: `Run the same command again to resume, or "imagegen models remove ${id}" to discard it`,
    });
    await writeManifest(dir, { files: digests, source: { repo: ref.repo, revision: ref.revision, commit, subfolder: subfolder || undefined } });
    const layout = await validateModel(dir, {
      load: pull.load ?? true,
      label,
      output: pull.output,
      advice: `Nothing was installed. Check that the repository holds a complete diffusers ONNX export${subfolder ? '' : ' (or pick its folder with --subfolder)'}`,
    });
    const installed = await installStaged(dir, pull.modelsDir, id, pull.force ?? false);
    await rm(staging, { recursive: true, force: true });
    return { id, dir: installed, family: layout.family, variant: layout.variant, bytes: total };
  } catch (err) {
    if (err instanceof DownloadInterrupted) throw err;
    await rm(staging, { recursive: true, force: true });
    throw isDiskFull(err) ? await diskFullError(pull.disk, pull.modelsDir, total, SPACE_ADVICE) : err;
  }
}

/** A disk too full for even the lock and the pull's state file: said as such, not as a bare ENOSPC. */
function startFailed(err: unknown, modelsDir: string): never {
  if (!isDiskFull(err)) throw err;
  throw new ModelInstallError(`the disk holding ${modelsDir} is full: the pull could not even start. ${SPACE_ADVICE}`);
}

function normaliseSubfolder(subfolder = ''): string {
  const normal = path.posix.normalize(subfolder.replaceAll('\\', '/')).replace(/^\/+|\/+$/g, '');
  if (normal === '.' || normal === '') return '';
  if (normal === '..' || normal.startsWith('../')) throw new ModelUsageError(`--subfolder '${subfolder}' leaves the repository; give a folder inside it, e.g. onnx`);
  return normal;
}

/** For a resume: LFS files by content hash, the others by git blob id. */
const contentId = (file: HubFile) => file.sha256 ?? file.gitBlobId ?? `size:${file.size}`;

/**
 * Keeps what an earlier run of the same pull downloaded, minus files whose content changed on the Hub
 * since; anything else in the staging folder (another repository's download) is discarded.
 */
async function prepareStaging(staging: string, state: PullState, output: ProgressOutput): Promise<void> {
  const stateFile = path.join(staging, STATE_FILE);
  const previous = await previousState(stateFile, output);
  const dir = path.join(staging, 'model');
  if (previous?.repo === state.repo && previous.subfolder === state.subfolder) {
    for (const file of await listFolder(dir).catch(() => [])) {
      const name = file.path.replace(/\.part$/, '');
      const unchanged = state.files[name] !== undefined && previous.files[name] === state.files[name];
      if (!unchanged) await rm(path.join(dir, file.path));
    }
  } else {
    if (previous) output.write(`discarding the unfinished download of ${previous.repo} kept for this id\n`);
    await rm(staging, { recursive: true, force: true });
  }
  await mkdir(dir, { recursive: true });
  await writeFile(stateFile, JSON.stringify(state));
}

/**
 * What an earlier run of the pull recorded in `stateFile`, or undefined where there is none. A record that
 * cannot be read (damaged, or edited by hand) is as none, said as such: what it kept is then discarded,
 * since nothing tells which files of which repository it holds.
 */
async function previousState(stateFile: string, output: ProgressOutput): Promise<PullState | undefined> {
  let reason: string;
  try {
    const value = await readJsonIfPresent(stateFile);
    if (value === undefined) return undefined;
    const parsed = pullStateSchema.safeParse(value);
    if (parsed.success) return parsed.data;
    reason = `${stateFile} is not a pull's record (${describeIssues(parsed.error)})`;
  } catch (err) {
    reason = messageOf(err);
  }
  output.write(`cannot resume the unfinished download kept for this id: ${reason}; starting it over\n`);
  return undefined;
}
