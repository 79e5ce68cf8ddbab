import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { npmRun } from '../scripts/npm-run.mjs';
import { unavailable } from '../src/runtime/providers.js';
import { syncFolder } from '../src/util/files.js';

/**
 * What differs on the systems the server has not run on (macOS, Windows), checked here on Linux through
 * the functions that take the platform as a parameter.
 */

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-portability-'));
});
afterEach(() => rm(dir, { recursive: true, force: true }));

describe('syncFolder', () => {
  it('flushes a folder where folders can be flushed, and fails for one that is not there', async () => {
    await expect(syncFolder(dir, 'linux')).resolves.toBeUndefined();
    await expect(syncFolder(dir, 'darwin')).resolves.toBeUndefined();
    await expect(syncFolder(path.join(dir, 'missing'), 'linux')).rejects.toMatchObject({ code: 'ENOENT' });
  });

  // procfs is a real file system whose folders have no flush: Linux answers EINVAL, as it does wherever a
  // file system's folders have no fsync (VirtualBox shared folders, SMB mounts of older kernels), where
  // every url request's put failed with a 500 after its images were generated.
  const noFolderFlush = '/proc';
  it.skipIf(!existsSync(noFolderFlush))(`leaves renames to a file system whose folders cannot be flushed (EINVAL; needs ${noFolderFlush} to show it)`, async () => {
    await expect(syncFolder(noFolderFlush, 'linux')).resolves.toBeUndefined();
  });

  it('leaves the folder alone on Windows, whose FlushFileBuffers refuses a folder (EPERM) and failed every image put', async () => {
    // Not even opened: a folder that is not there passes too.
    await expect(syncFolder(path.join(dir, 'missing'), 'win32')).resolves.toBeUndefined();
  });
});

describe("the prestart's npm run build", () => {
  const npmCli = '/usr/lib/node_modules/npm/bin/npm-cli.js';

  it('runs the npm that started it, by node, on every system', () => {
    for (const platform of ['linux', 'darwin', 'win32'] as const) {
      expect(npmRun('build', platform, { npm_execpath: npmCli })).toEqual({ command: process.execPath, args: [npmCli, 'run', 'build'], shell: false });
    }
  });

  it('started by another means, runs npm from PATH: on Windows through the shell, where npm is npm.cmd', () => {
    expect(npmRun('build', 'linux', {})).toEqual({ command: 'npm', args: ['run', 'build'], shell: false });
    expect(npmRun('build', 'win32', {})).toEqual({ command: 'npm run build', args: [], shell: true });
    // npm_execpath of a package manager that is no JavaScript file (a native binary) is not run by node.
    expect(npmRun('build', 'win32', { npm_execpath: 'C:\\tools\\bun.exe' })).toEqual({ command: 'npm run build', args: [], shell: true });
  });
});

describe('a GPU provider that this build of onnxruntime-node lacks', () => {
  it('is unavailable, so the worker runs on the CPU: CUDA on Windows and macOS, whose builds register no cuda backend', () => {
    // onnxruntime-common's words when no registered backend has the name (onnxruntime-node registers what its build has).
    const missing = (name: string) => new Error(`no available backend found. ERR: [${name}] backend not found.`);
    expect(unavailable('cuda', missing('cuda'))).toEqual({ reason: 'no available backend found. ERR: [cuda] backend not found.', remedy: expect.stringMatching(/Linux x64 only/) });
    expect(unavailable('webgpu', missing('webgpu'))?.reason).toBe('no available backend found. ERR: [webgpu] backend not found.');
    // A model's own failure stays the model's.
    expect(unavailable('cuda', new Error('Load model from x.onnx failed: Protobuf parsing failed.'))).toBeUndefined();
  });
});
