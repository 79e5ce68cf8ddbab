import { createReadStream, rmSync, type ReadStream } from 'node:fs';
import { lstat, open, readdir, realpath, stat, statfs } from 'node:fs/promises';
import path from 'node:path';
import { unlessMissing } from '../util/files.js';
import { formatBytes } from '../util/bytes.js';
import { ModelInstallError } from './errors.js';

/**
 * Everything installs write goes through `Disk`, so tests can make writes fail (a full disk) without
 * filling one. Also: listing a folder's files, and the space checks and messages.
 */

export interface FileWriter {
  write(chunk: Uint8Array): Promise<void>;
  /** Flushes to the device: a model is renamed into place only once its bytes are really on disk. */
  close(): Promise<void>;
}

export interface Disk {
  openWriter(file: string, mode: 'create' | 'append'): Promise<FileWriter>;
  /** Bytes an unprivileged process may still write on the file system holding `dir`. */
  freeBytes(dir: string): Promise<number>;
}

export const realDisk: Disk = {
  async openWriter(file, mode) {
    const handle = await open(file, mode === 'append' ? 'a' : 'w');
    return {
      async write(chunk) {
        for (let done = 0; done < chunk.length; ) done += (await handle.write(chunk, done, chunk.length - done)).bytesWritten;
      },
      async close() {
        try {
          await handle.datasync();
        } finally {
          await handle.close();
        }
      },
    };
  },
  async freeBytes(dir) {
    const fs = await statfs(dir);
    return fs.bavail * fs.bsize;
  },
};

/** Writes all of `source` to `file` through `disk`. */
export async function writeStream(disk: Disk, file: string, source: AsyncIterable<Uint8Array>, mode: 'create' | 'append' = 'create'): Promise<void> {
  const writer = await disk.openWriter(file, mode);
  try {
    for await (const chunk of source) await writer.write(chunk);
  } finally {
    await writer.close();
  }
}

/**
 * Reads a file (up to byte `end`, inclusive) in 1 MiB chunks: model files are gigabytes, and each
 * chunk costs a hash update and an awaited write (the default 64 KiB makes copies ~3x slower).
 */
export function readChunks(file: string, end?: number): ReadStream {
  return createReadStream(file, { highWaterMark: 1 << 20, end });
}

/** Fails before any byte is written when `needed` bytes cannot fit. */
export async function ensureFreeSpace(disk: Disk, dir: string, needed: number, advice: string): Promise<void> {
  const free = await disk.freeBytes(dir);
  if (free < needed) {
    throw new ModelInstallError(`not enough disk space in ${dir}: ${formatBytes(needed)} is needed and ${formatBytes(free)} is free. ${advice}`);
  }
}

/** The message for a write that hit a full disk, once the partial copy has been removed. */
export async function diskFullError(disk: Disk, dir: string, needed: number, advice: string): Promise<ModelInstallError> {
  const free = await disk.freeBytes(dir).then(formatBytes, () => 'an unknown amount');
  return new ModelInstallError(
    `the disk holding ${dir} is full: this needs ${formatBytes(needed)} and ${free} is free now (the partial copy was removed). ${advice}`,
  );
}

export async function sizeOf(file: string): Promise<number | undefined> {
  return (await unlessMissing(stat(file)))?.size;
}

export interface FoundFile {
  /** Relative to the listed folder, with forward slashes (the form manifests and bundles use). */
  path: string;
  size: number;
}

/**
 * Every file under `dir`. Symbolic links are followed: a Hugging Face cache snapshot, a common thing to
 * import, is a folder of links into its blob store.
 */
export async function listFolder(dir: string): Promise<FoundFile[]> {
  const found: FoundFile[] = [];
  // Each folder once: a link back up the tree would otherwise be walked until the path grew too long.
  const listed = new Set<string>();
  const visit = async (rel: string) => {
    const here = path.join(dir, rel);
    const real = await realpath(here);
    if (listed.has(real)) {
      throw new ModelInstallError(`${here} leads to a folder already listed (a symbolic link loop, or a second link to the same folder): remove the link, or copy the model without it`);
    }
    listed.add(real);
    for (const name of (await readdir(here)).sort()) {
      const child = rel ? `${rel}/${name}` : name;
      const info = await stat(path.join(dir, child)).catch((err: NodeJS.ErrnoException) => {
        // readdir named it, so it is a link that leads nowhere (or round in a circle).
        if (err.code !== 'ENOENT' && err.code !== 'ELOOP') throw err;
        throw new ModelInstallError(`${path.join(dir, child)} is a symbolic link to nothing that can be read (${err.code}): remove it, or replace it with the file it should lead to`);
      });
      if (info.isDirectory()) await visit(child);
      else if (info.isFile()) found.push({ path: child, size: info.size });
    }
  };
  await visit('');
  return found;
}

/** When anything at or under `entry` was last written (its newest modification time), links not followed; -Infinity when it is gone. */
export async function lastWritten(entry: string): Promise<number> {
  const info = await unlessMissing(lstat(entry));
  if (!info) return -Infinity;
  const names = info.isDirectory() ? ((await unlessMissing(readdir(entry))) ?? []) : [];
  const below = await Promise.all(names.map((name) => lastWritten(path.join(entry, name))));
  return Math.max(info.mtimeMs, ...below);
}

/**
 * Staging folders and partial bundles that must not outlive this process even when Ctrl-C ends it (the
 * CLI turns signals into process.exit, which runs 'exit' listeners). A pull's partial download is
 * deliberately not among them: it is kept for resuming.
 */
const removeOnExit = new Set<string>();
process.on('exit', () => {
  for (const target of removeOnExit) rmSync(target, { recursive: true, force: true });
});

export function removeIfInterrupted(target: string): void {
  removeOnExit.add(target);
}

export function keepAfterExit(target: string): void {
  removeOnExit.delete(target);
}
