import { execFile } from 'node:child_process';
import { mkdtemp, readdir, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { imagegenArgs } from './helpers/cli.js';
import { readImageFile } from './helpers/picture.js';

const run = promisify(execFile);
const root = path.resolve(import.meta.dirname, '..');

/** The real `imagegen generate` command, as a user runs it: no server, files out, progress on stderr. */
async function imagegen(...args: string[]) {
  return imagegenWith({}, ...args);
}

/** The same with `env` over this process's environment. */
async function imagegenWith(env: Record<string, string>, ...args: string[]) {
  return run(process.execPath, imagegenArgs(...args), { cwd: root, env: { ...process.env, ...env } });
}

describe('imagegen generate', () => {
  it('writes n images of the asked size with a progress bar over the denoising steps', async () => {
    const out = await mkdtemp(path.join(os.tmpdir(), 'imagegen-cli-'));
    const { stdout, stderr } = await imagegen('generate', 'a yellow square', '--n', '2', '--seed', '7', '--quality', 'hd', '--out', out);

    const files = (await readdir(out)).sort();
    expect(files).toEqual(['a-yellow-square-7.png', 'a-yellow-square-8.png']);
    expect(stdout.trim().split('\n')).toEqual(files.map((f) => path.join(out, f)));
    expect(stderr).toMatch(/100%\s+\d+ steps \/ \d+ steps/);
    for (const file of files) {
      const { info, reading } = await readImageFile(path.join(out, file));
      expect([info.width, info.height]).toEqual([512, 512]);
      expect(reading).toMatchObject({ colour: 'yellow', shape: 'square' });
    }

    // The same prompt and seed again (here with fewer steps) never overwrites the earlier picture.
    const again = await imagegen('generate', 'a yellow square', '--seed', '7', '--steps', '1', '--out', out);
    expect(again.stdout.trim()).toBe(path.join(out, 'a-yellow-square-7-2.png'));
    expect((await readdir(out)).sort()).toEqual(['a-yellow-square-7-2.png', 'a-yellow-square-7.png', 'a-yellow-square-8.png']);
  });

  it('rejects what the API rejects, with the same message', async () => {
    await expect(imagegen('generate', 'a red circle', '--n', '11')).rejects.toMatchObject({
      stderr: expect.stringContaining("Invalid 'n': integer above maximum value. Expected a value <= 10, but got 11 instead."),
    });
    // What the API cannot be sent (JSON has no NaN): the flag is named.
    for (const [flag, value] of [['--steps', 'abc'], ['--guidance-scale', 'NaN'], ['--seed', ''], ['--n', '0x2']]) {
      await expect(imagegen('generate', 'a red circle', flag, value)).rejects.toMatchObject({ stderr: `imagegen generate: ${flag} takes a number, not '${value}'\n` });
    }
    await expect(imagegen('generate', 'a red circle', '--model', 'no-such-model')).rejects.toMatchObject({
      stderr: expect.stringContaining("no model 'no-such-model'"),
    });
  });

  it('names the flag the request refuses and exits 2, as for every usage error; an --out it cannot write is refused before any picture is made', async () => {
    await expect(imagegen('generate', 'a red circle', '--rng', 'foo')).rejects.toMatchObject({ code: 2, stderr: expect.stringMatching(/^imagegen generate: --rng: Invalid value: 'foo'/) });
    await expect(imagegen('generate', 'a red circle', '--format', 'gif')).rejects.toMatchObject({ code: 2, stderr: expect.stringMatching(/^imagegen generate: --format: /) });
    const file = path.join(await mkdtemp(path.join(os.tmpdir(), 'imagegen-cli-')), 'a-file');
    await writeFile(file, 'not a folder');
    await expect(imagegen('generate', 'a red circle', '--out', file)).rejects.toMatchObject({ code: 2, stderr: expect.stringMatching(/--out '.*a-file' is a file, not a folder: name a folder you may write\n$/) });
    // Usage errors of any command: an unknown command, a missing argument or option.
    await expect(imagegen('no-such-command')).rejects.toMatchObject({ code: 2 });
    await expect(imagegen('generate')).rejects.toMatchObject({ code: 2, stderr: expect.stringContaining("missing required argument 'prompt'") });
    await expect(imagegen('models', 'verify', root)).rejects.toMatchObject({ code: 2, stderr: expect.stringContaining("required option '--golden <file>' not specified") });
  });

  it("reads only the settings it uses: a server's settings in the same environment do not stop it", async () => {
    const out = await mkdtemp(path.join(os.tmpdir(), 'imagegen-cli-'));
    // A server would refuse these (a public address without keys, a port that is no number).
    const { stdout } = await imagegenWith({ HOST: '0.0.0.0', PORT: 'abc', API_KEYS: '' }, 'generate', 'a red circle', '--size', '256x256', '--steps', '1', '--seed', '3', '--out', out);
    expect(stdout.trim()).toBe(path.join(out, 'a-red-circle-3.png'));
    await expect(imagegenWith({ EXECUTION_PROVIDER: 'tpu' }, 'generate', 'a red circle', '--out', out)).rejects.toMatchObject({ code: 2, stderr: expect.stringContaining('EXECUTION_PROVIDER (--execution-provider)') });
  });
});
