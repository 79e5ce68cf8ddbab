import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { lockPull, removeModel } from '../src/install/installer.js';
import { ownerHere, ownerRuns, takeLock } from '../src/install/owner.js';

/** A models folder on a file system without hard links (exFAT, FAT): link fails as Linux's vfat and exfat make it. */
vi.mock('node:fs/promises', async (importOriginal) => {
  const real = await importOriginal<typeof import('node:fs/promises')>();
  const link: typeof real.link = async () => {
    throw Object.assign(new Error('EPERM: operation not permitted, link'), { code: 'EPERM', syscall: 'link' });
  };
  return { ...real, link };
});

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-owner-'));
});
afterAll(() => rm(dir, { recursive: true, force: true }));

describe('a lock file where hard links cannot be made', () => {
  it('is taken, held against a second taker, and released', async () => {
    const file = path.join(dir, 'lock-model');
    const lock = await takeLock(file);
    expect('release' in lock).toBe(true);
    expect(await readFile(file, 'utf8')).toBe(ownerHere());
    expect(await takeLock(file)).toEqual({ heldBy: ownerHere() });
    if ('release' in lock) await lock.release();
    expect(await readdir(dir)).toEqual([]);
    const again = await takeLock(file);
    expect('release' in again).toBe(true);
    if ('release' in again) await again.release();
  });
});

describe("a pull's lock held by a process of another host or container", () => {
  it('is refused naming the lock file, which can be deleted where that pull is gone (it always counts as running)', async () => {
    const modelsDir = path.join(dir, 'models');
    const lock = path.join(modelsDir, '.staging', 'lock-model');
    await mkdir(path.dirname(lock), { recursive: true });
    await mkdir(path.join(modelsDir, 'model'));
    await writeFile(lock, '1@a-container-long-gone');
    const named = `(process 1@a-container-long-gone; if it no longer runs there, delete ${lock})`;
    await expect(lockPull(modelsDir, 'model')).rejects.toThrow(named);
    await expect(removeModel(modelsDir, 'model')).rejects.toThrow(named);
    await rm(lock);
    await (await lockPull(modelsDir, 'model')).release();
  });
});

describe('owners', () => {
  it.runIf(process.platform === 'linux')(
    "take a pid of this host name in another PID namespace (a host-network container's) for a running process, and a dead pid of this machine for a gone one",
    () => {
      const here = ownerHere();
      const machine = here.slice(here.indexOf('@') + 1);
      expect(machine).toMatch(/-pidns\d+$/);
      // Above Linux's largest pid_max (2^22): no process has it.
      const dead = 2 ** 22 + 1;
      expect(ownerRuns(`${dead}@${machine}`)).toBe(false);
      expect(ownerRuns(`${dead}@${machine.replace(/pidns\d+$/, 'pidns1')}`)).toBe(true);
      expect(ownerRuns(here)).toBe(true);
    },
  );
});
