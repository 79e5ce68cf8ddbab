import { execFile } from 'node:child_process';
import { cp, mkdir, mkdtemp, utimes, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import sharp from 'sharp';
import { describe, expect, it } from 'vitest';
import { readMemoryFigures } from '../src/models/memory-figures.js';
import { imagegenArgs, PROJECT_ROOT } from './helpers/cli.js';
import { cudaInstalled } from './helpers/cuda.js';

const run = promisify(execFile);

/**
 * The commands that run a model in their own process (generate, models verify) measure its memory as a
 * server's worker does, and keep the figures where the server keeps them (DATA_DIR): a model calibrated
 * once, by a server or a command, is not calibrated again by the next command. On a real SDXL on a CPU
 * the calibration takes tens of seconds, which every command paid.
 */

/** What the commands say as a calibration begins. */
const CALIBRATING = /measuring how much memory 'shapes' needs: two one-step runs/;

/** The demo model, copied into a models folder of its own as 'shapes', and a DATA_DIR: the test may change the model's files. */
async function setUp(): Promise<{ work: string; modelsDir: string; model: string; dataDir: string }> {
  const work = await mkdtemp(path.join(os.tmpdir(), 'imagegen-cli-memory-'));
  const modelsDir = path.join(work, 'models');
  const model = path.join(modelsDir, 'shapes');
  await cp(path.join(PROJECT_ROOT, 'models', 'demo-shapes'), model, { recursive: true });
  return { work, modelsDir, model, dataDir: path.join(work, 'data') };
}

/** `imagegen ...args` with `dataDir` as DATA_DIR; its stderr. */
async function stderrOf(dataDir: string, ...args: string[]): Promise<string> {
  const { stderr } = await run(process.execPath, imagegenArgs(...args), { cwd: PROJECT_ROOT, env: { ...process.env, DATA_DIR: dataDir }, timeout: 60_000 });
  return stderr;
}

/** Runs `command` three times: calibrated the first, not the second, and again once the model's weights changed (a newer mtime, as a copy over them leaves). */
async function calibratesOnce(command: (dataDir: string) => Promise<string>, model: string, dataDir: string): Promise<void> {
  expect(await command(dataDir)).toMatch(CALIBRATING);
  const first = (await readMemoryFigures(dataDir))[model];
  // The server's file, read as the server reads it: the calibration's two sizes, and the files' version.
  expect(first?.denoise).toHaveLength(2);
  expect(first?.version).toEqual(expect.any(String));

  expect(await command(dataDir)).not.toMatch(CALIBRATING);

  const later = new Date(Date.now() + 60_000);
  await utimes(path.join(model, 'unet', 'model.onnx_data'), later, later);
  expect(await command(dataDir)).toMatch(CALIBRATING);
  const replaced = (await readMemoryFigures(dataDir))[model];
  expect(replaced?.version).not.toBe(first?.version);
  expect(replaced?.denoise).toHaveLength(2);
}

describe("a model's memory, measured once for the commands and the server", () => {
  it('imagegen generate calibrates a model once per version of its files', async () => {
    const { work, modelsDir, model, dataDir } = await setUp();
    const out = path.join(work, 'out');
    const generate = (dir: string) => stderrOf(dir, 'generate', 'a red circle', '--models-dir', modelsDir, '--model', 'shapes', '--size', '256x256', '--steps', '1', '--seed', '1', '--out', out);
    await calibratesOnce(generate, model, dataDir);
  });

  it.skipIf(cudaInstalled)("keeps no figures as CUDA's where the CUDA provider did not start and the model ran on the CPU, and says so (skipped: the CUDA provider is installed here)", async () => {
    const { work, modelsDir, dataDir } = await setUp();
    const args = imagegenArgs('generate', 'a red circle', '--models-dir', modelsDir, '--model', 'shapes', '--size', '256x256', '--steps', '1', '--out', path.join(work, 'out'));
    const { stderr } = await run(process.execPath, args, { cwd: PROJECT_ROOT, env: { ...process.env, DATA_DIR: dataDir, EXECUTION_PROVIDER: 'cuda' }, timeout: 60_000 });
    expect(stderr).toMatch(CALIBRATING);
    expect(stderr).toContain("(not kept: these are the CPU's, the cuda provider did not start)");
    expect(await readMemoryFigures(dataDir, 'cuda')).toEqual({});
  });

  it('says that a DATA_DIR that is a file is no folder, rather than that its figures are damaged and to free space', async () => {
    const { work, modelsDir, dataDir } = await setUp();
    await writeFile(dataDir, 'a file where DATA_DIR should be a folder');
    const stderr = await stderrOf(dataDir, 'generate', 'a red circle', '--models-dir', modelsDir, '--model', 'shapes', '--size', '256x256', '--steps', '1', '--out', path.join(work, 'out'));
    expect(stderr).not.toMatch(/damaged\?|free space|is rewritten/);
    const advice = `DATA_DIR (${dataDir}) is a file, or a folder on its path is: set DATA_DIR to a folder`;
    expect(stderr).toContain(`DATA_DIR/model-memory.json cannot be read (ENOTDIR): each model is measured again as it first loads; ${advice}`);
    expect(stderr).toMatch(new RegExp(`memory figures cannot be written to DATA_DIR/model-memory\\.json \\((EEXIST|ENOTDIR)\\): .*; ${advice.replace(/[()]/g, '\\$&')}`));
  });

  it("says that a figures' file that is a folder is one, rather than to let this user write DATA_DIR", async () => {
    const { work, modelsDir, dataDir } = await setUp();
    await mkdir(path.join(dataDir, 'model-memory.json'), { recursive: true });
    const stderr = await stderrOf(dataDir, 'generate', 'a red circle', '--models-dir', modelsDir, '--model', 'shapes', '--size', '256x256', '--steps', '1', '--out', path.join(work, 'out'));
    expect(stderr).toContain(`memory figures cannot be written to DATA_DIR/model-memory.json (EISDIR): they serve this process, but the next server or command measures each model again as it first loads; ${path.join(dataDir, 'model-memory.json')} is a folder, where the figures' file should be: remove it`);
  });

  it('imagegen models verify calibrates a model once per version of its files', async () => {
    const { work, model, dataDir } = await setUp();
    // A golden case of the model's shapes; the pictures need not match (--tolerance 1 passes any): the case runs the model.
    const golden = path.join(work, 'golden');
    await mkdir(golden);
    await writeFile(path.join(golden, 'latents.bin'), new Uint8Array(4 * 4 * 32 * 32));
    await sharp({ create: { width: 256, height: 256, channels: 3, background: 'gray' } }).png().toFile(path.join(golden, 'image.png'));
    const latents = { file: 'latents.bin', dtype: 'float32', shape: [1, 4, 32, 32] };
    const cases = [{ prompt: 'a red circle', steps: 1, guidance: 1, width: 256, height: 256, seed: 0, latents, image: { file: 'image.png' } }];
    await writeFile(path.join(golden, 'golden.json'), JSON.stringify({ cases }));
    const verify = (dir: string) => stderrOf(dir, 'models', 'verify', model, '--golden', path.join(golden, 'golden.json'), '--tolerance', '1');
    await calibratesOnce(verify, model, dataDir);
  });
});
