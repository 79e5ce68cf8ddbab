/** A model folder's contents before it is written: relative path -> file contents. */
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';

export type Files = Record<string, string | Uint8Array>;

/** JSON as the Hugging Face tools write it: two-space indent, trailing newline. */
export function json(value: unknown): string {
  return `${JSON.stringify(value, null, 2)}\n`;
}

/** Prefixes every path with `folder/`. */
export function inFolder(folder: string, files: Files): Files {
  return Object.fromEntries(Object.entries(files).map(([path, data]) => [`${folder}/${path}`, data]));
}

export async function writeFiles(root: string, files: Files): Promise<void> {
  for (const [path, data] of Object.entries(files)) {
    const target = join(root, path);
    await mkdir(dirname(target), { recursive: true });
    await writeFile(target, data);
  }
}
