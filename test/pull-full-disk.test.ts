import { mkdtemp, readdir, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, expect, inject, it, vi } from 'vitest';
import { pullModel } from '../src/install/index.js';
import { FakeHub, readFolderFiles } from './helpers/fake-hub.js';

/**
 * A pull on a disk too full for its first small files (the lock naming the process, the pull's state):
 * a file system's ENOSPC is faked for them, as the install's Disk seam does not carry them.
 */

vi.mock('node:fs/promises', async (importOriginal) => {
  const real = await importOriginal<typeof import('node:fs/promises')>();
  const writeFile: typeof real.writeFile = async (file, data, options) => {
    if (!String(file).includes(`${path.sep}.staging${path.sep}`)) return real.writeFile(file, data, options);
    // As a full disk does: the file is created, its first write fails.
    await real.writeFile(file, '');
    throw Object.assign(new Error(`ENOSPC: no space left on device, write`), { code: 'ENOSPC', syscall: 'write' });
  };
  return { ...real, writeFile };
});

let hub: FakeHub;
let work: string;
beforeAll(async () => {
  hub = await FakeHub.start();
  hub.addRepo('test-org/model', await readFolderFiles(path.join(inject('referenceModelsDir'), 'sd-turbo')));
  work = await mkdtemp(path.join(os.tmpdir(), 'imagegen-full-'));
});
afterAll(async () => {
  await hub.close();
  await rm(work, { recursive: true, force: true });
});

it('says that the disk is full, and leaves no file behind, when even the pull lock cannot be written', async () => {
  const modelsDir = path.join(work, 'models');
  const output = { write: () => true, isTTY: false as const };
  await expect(pullModel({ modelsDir, repo: 'test-org/model', hubUrl: hub.url, output, load: false })).rejects.toThrow(
    `the disk holding ${modelsDir} is full: the pull could not even start. Free up space, or use a --models-dir on a bigger disk, then pull again`,
  );
  expect(await readdir(path.join(modelsDir, '.staging'))).toEqual([]);
});
