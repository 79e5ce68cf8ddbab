import { mkdir, rename } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import path from 'node:path';
import { readChunks, sizeOf, writeStream, type Disk } from './disk.js';
import { DownloadInterrupted, ModelInstallError } from './errors.js';
import { ConnectionLost, type HubClient, type HubFile, type RepoRef } from './hub-client.js';
import type { FileDigest } from './manifest.js';
import { printable } from '../util/printable.js';
import { Progress, type ProgressOutput } from '../util/progress.js';
import { FileHasher, hashing, verifiedDigest } from './verifier.js';

/**
 * Downloads Hub files into a folder, one at a time, verifying each. A file being downloaded is
 * `<name>.part` and renamed once verified, so a later run knows what is complete; a dropped connection
 * is retried from where it stopped (HTTP Range), and if it keeps failing the parts stay for the next run.
 */

export interface DownloadPlan {
  hub: HubClient;
  ref: RepoRef;
  commit: string;
  files: HubFile[];
  dir: string;
  /** bytesPresent(dir, files), which the caller measured to check the free space. */
  present: number;
  disk: Disk;
  output: ProgressOutput;
  /** Attempts after the first for a file whose connection dropped. */
  retries: number;
  /** Wait before the first retry; doubled for each next one. */
  retryDelayMs: number;
  /** Added to the message when the download gives up, e.g. the command that resumes it. */
  resumeAdvice: string;
}

const partOf = (file: string) => `${file}.part`;

/** Bytes of `files` already in `dir` from an earlier run, finished or partial. */
export async function bytesPresent(dir: string, files: HubFile[]): Promise<number> {
  let total = 0;
  for (const file of files) {
    const dest = path.join(dir, file.path);
    total += Math.min(file.size, (await sizeOf(dest)) ?? (await sizeOf(partOf(dest))) ?? 0);
  }
  return total;
}

/** Downloads every file of the plan; returns their digests by path. */
export async function downloadFiles(plan: DownloadPlan): Promise<Record<string, FileDigest>> {
  const total = plan.files.reduce((sum, file) => sum + file.size, 0);
  const { present } = plan;
  const progress = new Progress(plan.output, 'downloading', total, present);
  if (present > 0) progress.note(`resuming: ${Math.round((present / total) * 100)}% already downloaded`);
  const digests: Record<string, FileDigest> = {};
  for (const file of plan.files) {
    progress.startFile(file.path);
    digests[file.path] = await downloadWithRetries(plan, file, progress);
    progress.fileDone();
  }
  progress.finish();
  return digests;
}

async function downloadWithRetries(plan: DownloadPlan, file: HubFile, progress: Progress): Promise<FileDigest> {
  // Printed on the user's terminal: the repository names its files (see printable).
  const shown = printable(file.path);
  for (let attempt = 1; ; attempt++) {
    try {
      return await downloadFile(plan, file, progress);
    } catch (err) {
      if (!(err instanceof ConnectionLost)) throw err;
      if (attempt > plan.retries) {
        throw new DownloadInterrupted(`the connection dropped while downloading ${shown} (${err.message}); what arrived is kept. ${plan.resumeAdvice}`);
      }
      const wait = plan.retryDelayMs * 2 ** (attempt - 1);
      progress.note(`connection dropped while downloading ${shown} (${err.message}); resuming in ${wait / 1000}s (retry ${attempt} of ${plan.retries})`);
      await sleep(wait);
    }
  }
}

/**
 * `body`, failing with `tooLong()` at the first chunk past `bytes`: a server whose copy is longer than
 * its listing says (or whose body never ends) would otherwise fill the disk before the check of the
 * whole file refused it. Stopping the loop cancels the download.
 */
async function* atMost(body: AsyncIterable<Uint8Array>, bytes: number, tooLong: () => Error): AsyncIterable<Uint8Array> {
  let left = bytes;
  for await (const chunk of body) {
    if (chunk.length > left) throw tooLong();
    left -= chunk.length;
    yield chunk;
  }
}

async function downloadFile(plan: DownloadPlan, file: HubFile, progress: Progress): Promise<FileDigest> {
  const dest = path.join(plan.dir, file.path);
  const part = partOf(dest);
  const advice = `The download was discarded. Run the pull again; if this keeps happening, ${plan.hub.hubUrl} serves a file that differs from its own listing (a stale mirror?)`;
  const expected = { size: file.size, sha256: file.sha256, gitBlobId: file.gitBlobId };
  const newHasher = () => new FileHasher(file.gitBlobId ? file.size : undefined);

  // Finished by an earlier run: hashed again, since the manifest needs its sha256 anyway.
  if ((await sizeOf(dest)) !== undefined) {
    const hasher = newHasher();
    for await (const chunk of readChunks(dest)) hasher.update(chunk);
    return verifiedDigest(file.path, hasher, expected, advice);
  }

  await mkdir(path.dirname(dest), { recursive: true });
  let offset = (await sizeOf(part)) ?? 0;
  if (offset > file.size) {
    progress.add(-file.size);
    offset = 0;
  }
  let hasher = newHasher();
  if (offset > 0) for await (const chunk of readChunks(part, offset - 1)) hasher.update(chunk);

  // offset 0 also covers empty files, which still need creating.
  if (offset === 0 || offset < file.size) {
    const download = await plan.hub.download(plan.ref, plan.commit, file.repoPath, offset);
    if (download.restarted && offset > 0) {
      progress.add(-offset);
      hasher = newHasher();
      offset = 0;
    }
    const tooLong = () => new ModelInstallError(`${printable(file.path)} failed verification: ${plan.hub.hubUrl} sent more than the ${file.size} bytes its listing gives. ${advice}`);
    const body = atMost(download.body, file.size - offset, tooLong);
    await writeStream(plan.disk, part, progress.counting(hashing(body, hasher)), offset > 0 ? 'append' : 'create');
    if (hasher.size < file.size) throw new ConnectionLost(`the server closed the connection after ${hasher.size} of ${file.size} bytes`);
  }

  const digest = verifiedDigest(file.path, hasher, expected, advice);
  await rename(part, dest);
  return digest;
}
