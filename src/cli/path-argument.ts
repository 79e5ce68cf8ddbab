import { InvalidArgumentError } from 'commander';
import { unexpandedHome } from '../util/home-path.js';

/**
 * A path argument or flag, as commander's argParser: an empty one (a script's unset variable in
 * `--out "$OUT"`) is refused as a usage error before any work, rather than taken for no file at all
 * (export wrote a whole bundle to '.partial' before its rename to '' failed) or for the current folder;
 * and one beginning with a `~` no shell expanded (util/home-path.ts).
 */
export function pathArgument(value: string): string {
  if (value.trim() === '') throw new InvalidArgumentError('It is empty: give the path of a file or folder (in a script, is the variable set?).');
  refuseUnexpandedHome(value);
  return value;
}

/** Refuses, as a usage error naming the path meant, a value beginning with a `~` no shell expanded (util/home-path.ts). */
export function refuseUnexpandedHome(value: string): void {
  const home = unexpandedHome(value);
  if (home) throw new InvalidArgumentError(`${home}.`);
}
