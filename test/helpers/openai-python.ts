import { execFile } from 'node:child_process';
import { mkdir, rename, rm } from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { PROJECT_ROOT } from './cli.js';

/**
 * The official openai-python at a given version, in a virtual environment of its own made once with
 * `python3 -m venv` and `pip install openai==<version>` and kept under node_modules/.cache (CI runs
 * `npm ci && npm test`, which empties node_modules: each run makes them again, a few seconds each). pip
 * uses the machine's own configuration (an index or wheel folder it names); without python3, its venv
 * module, or a wheel pip can get, the answer says why, for the test's name.
 */

const run = promisify(execFile);

/** The openai-python release the project's tests and docs' examples run (the current major). */
export const CURRENT_OPENAI_PYTHON = '3.22.1';

export type OpenaiPython = { python: string } | { missing: string };

const CACHE = path.join(PROJECT_ROOT, 'node_modules', '.cache', 'openai-python');

/** Why a command failed: not there at all, else the last line it wrote (pip and venv put the reason there), else its exit code. */
function why(err: unknown): string {
  const { code, stderr } = err as { code?: unknown; stderr?: string };
  if (code === 'ENOENT') return 'not found';
  return stderr?.trim().split('\n').at(-1)?.trim() || `exit code ${String(code)}`;
}

/** Whether the environment's python imports openai at `version`. */
async function imports(python: string, version: string): Promise<boolean> {
  try {
    const { stdout } = await run(python, ['-c', 'import openai; print(openai.__version__)']);
    return stdout.trim() === version;
  } catch {
    return false;
  }
}

export async function openaiPython(version: string): Promise<OpenaiPython> {
  const dir = path.join(CACHE, version);
  const python = path.join(dir, 'bin', 'python');
  if (await imports(python, version)) return { python };
  // Made beside it and moved into place whole: a run killed halfway leaves no environment that looks made.
  const making = `${dir}.making-${process.pid}`;
  await rm(making, { recursive: true, force: true });
  await mkdir(CACHE, { recursive: true });
  try {
    await run('python3', ['-m', 'venv', making]);
  } catch (err) {
    return { missing: `python3 -m venv failed: ${why(err)}` };
  }
  try {
    // No retries: an index out of reach (public PyPI offline) is skipped at once instead of after a minute of them.
    await run(path.join(making, 'bin', 'python'), ['-m', 'pip', 'install', '--quiet', '--disable-pip-version-check', '--retries', '0', '--timeout', '30', `openai==${version}`]);
  } catch (err) {
    await rm(making, { recursive: true, force: true });
    return { missing: `pip cannot install openai==${version}: ${why(err)}` };
  }
  // Test files run at once may each make one: the first in place is kept, and a later one is dropped
  // (a rename onto a folder that holds files fails) rather than replacing it under the first's tests.
  // Only a folder there that does not import (made by a python3 since replaced) is removed for ours:
  // removed whenever ours found none there, the first's could go between its move and its tests.
  await rename(making, dir).catch(async (err: NodeJS.ErrnoException) => {
    if (err.code !== 'ENOTEMPTY' && err.code !== 'EEXIST') throw err;
    if (await imports(python, version)) return;
    await rm(dir, { recursive: true, force: true });
    await rename(making, dir);
  });
  await rm(making, { recursive: true, force: true });
  return (await imports(python, version)) ? { python } : { missing: `openai==${version} installed but does not import` };
}
