import { open, rename, unlink } from 'node:fs/promises';
import path from 'node:path';
import { deleteStaleFiles, syncFolder } from '../util/files.js';

/**
 * How the file store writes an image: to a temporary name, flushed to the disk and renamed, and the
 * rename flushed, before the image's URL is given, so that neither a reader nor a restart after a power
 * loss sees half an image, or loses one whose URL went out. A failed write deletes its temporary file;
 * deleteStaleTempFiles deletes those a crash left.
 */

const TEMP_FILE = /^\..*\.tmp$/;

/** A temporary file older than this was left by a crash, not written now by another server. */
const TEMP_FILE_AGE_MS = 10 * 60_000;

/** The temporary file the write of image `id` into `dir` goes through: hidden, and no image's name. */
export const tempFileOf = (dir: string, id: string): string => path.join(dir, `.${id}.tmp`);

/** Writes `data` to `file` through `temp`; on failure neither is left behind, and the error is the file system's. */
export async function writeDurably(temp: string, file: string, data: Uint8Array): Promise<void> {
  try {
    const handle = await open(temp, 'wx');
    try {
      await handle.writeFile(data);
      // On the disk before it gets its name: renamed first, a power loss could leave a named file that
      // is empty or short, which a restart would index and serve (a millisecond or so per image).
      await handle.datasync();
    } finally {
      await handle.close();
    }
    await rename(temp, file);
    // The name too: until the folder is flushed, a power loss soon after the answer could leave only
    // the temporary file (which the sweeper deletes) behind a URL the client was given.
    await syncFolder(path.dirname(file));
  } catch (err) {
    // A full disk fails a write halfway: no partial file may stay behind; nor an image whose put failed
    // after its rename (its name not flushed), which no answer names.
    for (const left of [temp, file]) await unlink(left).catch(() => undefined);
    throw err;
  }
}

/** Deletes the temporary files in `dir` that a crash left: only those older than any write takes, as another server sharing the folder may be writing the others. */
export function deleteStaleTempFiles(dir: string): Promise<void> {
  return deleteStaleFiles(dir, TEMP_FILE, TEMP_FILE_AGE_MS);
}
