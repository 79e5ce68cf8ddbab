import os from 'node:os';
import path from 'node:path';

/**
 * A path that begins with `~`: the shell turns it into the home folder only at the start of a word, so
 * `--models-dir=~/models`, a quoted "~/models" and `MODELS_DIR=~/models` in an environment file reach us
 * as they were typed, and Node takes them for a folder named `~` in the current folder: a model was
 * installed, and pictures written, where no server and no user looked. Refused, naming the path meant.
 */

/** Why `value` cannot be taken as given, with the path to write instead; undefined for any other path. */
export function unexpandedHome(value: string): string | undefined {
  const match = /^~([^/\\]*)(?:[/\\](.*))?$/s.exec(value.trim());
  if (!match) return undefined;
  const [, user, rest = ''] = match;
  // Another user's home (~bob): only the system's user database knows where it is.
  const meant = user ? `the full path of ${user}'s home folder${rest ? ` followed by /${rest}` : ''}` : path.join(os.homedir(), rest);
  return (
    `'${value}' begins with '~', which only a shell turns into the home folder, and none did here ` +
    `(none does after a flag's '=', in quotes, or in an environment file): write ${meant}, or ./${value.trim()} for a folder named '~${user}' here`
  );
}
