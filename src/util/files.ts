import { access, mkdir, open, readdir, readFile, stat, unlink } from 'node:fs/promises';
import path from 'node:path';
import type { z } from 'zod';
import { messageOf } from './error-message.js';

/** Files that may be absent, and the optional JSON files of model folders and bundles (configs, tokenizers, manifests). */

/** What a file operation gives, or undefined when the file does not exist; other errors (permissions, I/O) propagate. */
export async function unlessMissing<T>(operation: Promise<T>): Promise<T | undefined> {
  try {
    return await operation;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
}

/**
 * Flushes a folder's entries to the disk: a file renamed into it is then there after a power loss too
 * (its data flushed before the rename). Not on Windows, which has no such flush: a folder opens there
 * (libuv opens every path with FILE_FLAG_BACKUP_SEMANTICS), but FlushFileBuffers refuses a handle
 * without write access (EPERM), which failed every image's put; NTFS journals the rename itself.
 * `platform` is a parameter for the tests. Where a folder cannot be opened to be flushed, or its file
 * system has no flush for folders (FOLDER_FLUSH_REFUSED), its renames are left to the file system.
 */
export async function syncFolder(dir: string, platform: NodeJS.Platform = process.platform): Promise<void> {
  if (platform === 'win32') return;
  const handle = await open(dir, 'r').catch((err: NodeJS.ErrnoException) => {
    if (err.code === 'EISDIR' || err.code === 'EPERM') return undefined;
    throw err;
  });
  if (!handle) return;
  try {
    await handle.sync().catch((err: NodeJS.ErrnoException) => {
      if (!FOLDER_FLUSH_REFUSED.has(err.code ?? '')) throw err;
    });
  } finally {
    await handle.close();
  }
}

/**
 * How a file system that cannot flush a folder answers: EINVAL from Linux where its folders have no
 * fsync (procfs; VirtualBox shared folders and SMB mounts of older kernels), EBADF where a system will
 * not flush a read-only handle. Thrown, it failed every image's put there after its generation (a 500
 * storage_error), though the image had been written and renamed. PostgreSQL's fsync_fname ignores the same two.
 */
const FOLDER_FLUSH_REFUSED = new Set(['EINVAL', 'EBADF']);

/**
 * Makes a folder and its missing parents, one at a time, so that the error is the real one, from the
 * first folder that cannot be made. Not Node's recursive mkdir: it reports a read-only or forbidden
 * parent as ENOENT ("does not exist"), and where a file system refuses a folder with ENOENT though its
 * parent exists (under /proc) it retries forever (Node 20), hanging the command or the server's start.
 * Returns the folders it made (or found made meanwhile), outermost first.
 */
export async function makeFolder(dir: string): Promise<string[]> {
  const missing: string[] = [];
  for (let folder = path.resolve(dir); !(await exists(folder)) && path.dirname(folder) !== folder; folder = path.dirname(folder)) missing.unshift(folder);
  for (const folder of missing) {
    await mkdir(folder).catch((err: NodeJS.ErrnoException) => {
      // Made meanwhile by someone else: as good.
      if (err.code !== 'EEXIST') throw err;
    });
  }
  // Shaped as mkdir's own error (syscall included), which the commands report as a message, not a stack trace.
  if (!(await stat(dir)).isDirectory()) throw Object.assign(new Error(`EEXIST: a file is in the way, mkdir '${dir}'`), { code: 'EEXIST', syscall: 'mkdir', path: dir });
  return missing;
}

/** Whether a file (or folder) is there and reachable. */
export async function exists(file: string): Promise<boolean> {
  try {
    await access(file);
    return true;
  } catch {
    return false;
  }
}

/**
 * Why `data` is no UTF-8 text, where it is UTF-16 (its byte-order mark says so), or undefined. Windows
 * PowerShell 5 saves text so (`>`, Out-File, Set-Content -Encoding Unicode), as Notepad's "Unicode" does:
 * read as UTF-8, every other byte is a NUL, and a file of keys or settings was refused for what it
 * seemed to hold (a key that is not printable, a JSON token that is not one), not for how it was saved.
 */
export function utf16Problem(data: Uint8Array): string | undefined {
  const utf16 = (data[0] === 0xff && data[1] === 0xfe) || (data[0] === 0xfe && data[1] === 0xff);
  return utf16 ? 'saved as UTF-16 (as Windows PowerShell 5 and Notepad\'s "Unicode" save text): save it as UTF-8' : undefined;
}

/** A file's text, or undefined when there is no such file; throws for one saved as UTF-16 (see utf16Problem). */
export async function readTextIfPresent(file: string): Promise<string | undefined> {
  const data = await unlessMissing(readFile(file));
  if (data === undefined) return undefined;
  const problem = utf16Problem(data);
  if (problem) throw new Error(`${file} is ${problem}`);
  return data.toString('utf8');
}

/**
 * The numbers Python's json module writes for float('inf'), float('-inf') and float('nan'), which JSON
 * has no spelling for (diffusers saves DPM-Solver's lambda_min_clipped as -Infinity), outside strings.
 */
const PYTHON_NUMBERS = /"(?:[^"\\]|\\.)*"|(-?Infinity|NaN)/g;
/** A string no config holds, standing for one of them while JSON.parse reads the rest. */
const STANDS_FOR = '\u0000python-number:';
const PYTHON_VALUES: Record<string, number> = { Infinity, '-Infinity': -Infinity, NaN };

/** Parses JSON text, also as Python's json module writes it (see PYTHON_NUMBERS) or with a byte-order mark; the error names `where` (usually the file). */
export function parseJson(source: string, where: string): unknown {
  // A byte-order mark, as Windows editors (Notepad before 2019, PowerShell's UTF8) save a file: JSON.parse
  // refuses it with "Unexpected token" and an invisible character, which RFC 8259 lets a parser ignore.
  const text = source.startsWith('\uFEFF') ? source.slice(1) : source;
  try {
    return JSON.parse(text);
  } catch (err) {
    const spelled = text.replace(PYTHON_NUMBERS, (token, number?: string) => (number ? JSON.stringify(STANDS_FOR + number) : token));
    if (spelled !== text) {
      try {
        return JSON.parse(spelled, (_key, value: unknown) =>
          typeof value === 'string' && value.startsWith(STANDS_FOR) ? PYTHON_VALUES[value.slice(STANDS_FOR.length)] : value,
        );
      } catch {
        // Not valid for another reason: the first error says where.
      }
    }
    throw new Error(`${where} is not valid JSON (${messageOf(err)}${whereInText(text, messageOf(err))})`);
  }
}

/**
 * Where in `text` the JSON error `message` is, as an editor shows it, and what is there when it is what
 * a hand edit adds that JSON has no room for: Node 20 gives only an offset ("at position 212"), which
 * an operator who edited imagegen.json had to count out by hand, and a comment or a trailing comma
 * (what JSON-with-comments files such as VS Code's settings take) was told apart from nothing else.
 */
function whereInText(text: string, message: string): string {
  const position = /at position (\d+)/.exec(message)?.[1];
  if (position === undefined) return '';
  const before = text.slice(0, Number(position));
  const line = before.split('\n').length;
  const column = Number(position) - before.lastIndexOf('\n');
  const found = /^\/[/*]/.test(text.slice(Number(position)))
    ? ': a comment, which JSON does not allow: remove it'
    : before.trimEnd().endsWith(',') && /^[\]}]/.test(text.slice(Number(position)))
      ? ': a comma before the closing bracket, which JSON does not allow: remove it'
      : '';
  return `, line ${line} column ${column}${found}`;
}

/** A JSON file's value, or undefined when there is no such file. */
export async function readJsonIfPresent(file: string): Promise<unknown> {
  const text = await readTextIfPresent(file);
  return text === undefined ? undefined : parseJson(text, file);
}

/** A schema's complaints on one line, `path: message; ...` (`(top)` for the value itself). */
export function describeIssues(error: z.ZodError): string {
  return error.issues.map((issue) => `${issue.path.join('.') || '(top)'}: ${issue.message}`).join('; ');
}

/** Whether a write failed for want of room: the disk is full (ENOSPC) or the user's quota spent (EDQUOT). */
export function isDiskFull(err: unknown): boolean {
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  return code === 'ENOSPC' || code === 'EDQUOT';
}

/**
 * Deletes the files of `dir` named as `pattern` says whose last write is more than `olderThanMs` ago:
 * the temporary files that a process killed between a write and its rename left, which nothing else
 * would ever delete. Younger ones may be another process's write under way (one sharing the folder,
 * on this machine or another), so they are left be. A file gone meanwhile, or one that cannot be
 * deleted, is skipped; a folder that cannot be listed throws.
 */
export async function deleteStaleFiles(dir: string, pattern: RegExp, olderThanMs: number): Promise<void> {
  const names = (await unlessMissing(readdir(dir))) ?? [];
  for (const name of names.filter((n) => pattern.test(n))) {
    const file = path.join(dir, name);
    const stats = await unlessMissing(stat(file));
    if (stats && Date.now() - stats.mtimeMs > olderThanMs) await unlink(file).catch(() => undefined);
  }
}
