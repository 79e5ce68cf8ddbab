import { execFile } from 'node:child_process';
import { mkdtemp, readdir } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { readImageFile } from './helpers/picture.js';

const run = promisify(execFile);
const root = path.resolve(import.meta.dirname, '..');

/** The real `imagegen generate` command, as a user runs it: no server, files out, progress on stderr. */
async function imagegen(...args: string[]) {
  return run(process.execPath, ['--import', 'tsx', path.join(root, 'src/cli/main.ts'), ...args], { cwd: root });
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
});
