import { readFileSync } from 'node:fs';

/**
 * A /proc or /sys file's text, or undefined where this system has none (not Linux, not mounted, not
 * readable): the memory figures then fall back to portable ones. Read synchronously: these files are
 * small and in memory, and the plan reads a few per batch.
 */
export function kernelText(file: string): string | undefined {
  try {
    return readFileSync(file, 'utf8');
  } catch {
    return undefined;
  }
}
