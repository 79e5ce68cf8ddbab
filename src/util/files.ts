import { access, readFile } from 'node:fs/promises';
import type { z } from 'zod';

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

/** Whether a file (or folder) is there and reachable. */
export async function exists(file: string): Promise<boolean> {
  try {
    await access(file);
    return true;
  } catch {
    return false;
  }
}

/** A file's text, or undefined when there is no such file. */
export function readTextIfPresent(file: string): Promise<string | undefined> {
  return unlessMissing(readFile(file, 'utf8'));
}

/** Parses JSON text; the error names `where` (usually the file). */
export function parseJson(text: string, where: string): unknown {
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new Error(`${where} is not valid JSON (${(err as Error).message})`);
  }
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
