import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
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

  it('leaves the folder alone on Windows, whose FlushFileBuffers refuses a folder (EPERM) and failed every image put', async () => {
    // Not even opened: a folder that is not there passes too.
    await expect(syncFolder(path.join(dir, 'missing'), 'win32')).resolves.toBeUndefined();
  });
});
