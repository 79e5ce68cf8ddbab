import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { ownerHere, takeLock } from '../src/install/owner.js';

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
