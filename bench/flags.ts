import path from 'node:path';
import { parseArgs, type ParseArgsConfig } from 'node:util';

/**
 * A benchmark's command line. A mistake in it (a flag it does not know, a flag without its value, a
 * count that is no number) ends the benchmark before any work with one line that names the flag, and
 * exit status 2, as the CLI's usage errors do: node's parseArgs threw a stack trace, and a count such as
 * `--requests 2k` read as NaN ran a benchmark of nothing that still printed a table.
 */

/** Ends the benchmark for a mistake in its command line: `message` on stderr, exit status 2. */
export function refuse(message: string): never {
  console.error(`${path.basename(process.argv[1] ?? 'bench')}: ${message}`);
  process.exit(2);
}

/** The flags of `config` (node's parseArgs), or the end of the benchmark, saying what is wrong. */
export function benchFlags<T extends ParseArgsConfig>(config: T): ReturnType<typeof parseArgs<T>> {
  try {
    return parseArgs(config);
  } catch (err) {
    // parseArgs says what it refuses and how to mean it ("Unknown option '--x'. To specify a positional argument ...").
    return refuse(err instanceof Error ? err.message : String(err));
  }
}

/** The whole number that `--flag` was given (`text`), at least `least`; else the end of the benchmark, naming the flag. */
export function wholeNumber(flag: string, text: string, least = 1): number {
  const value = Number(text);
  if (!/^\d+$/.test(text.trim()) || value < least) refuse(`--${flag} takes a whole number of at least ${least}, not '${text}'`);
  return value;
}
