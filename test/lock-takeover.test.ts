import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ownerHere, takeLock } from '../src/install/owner.js';

/**
 * Taking over a lock file whose owner was killed (a crashed `imagegen models pull`), with many takers at
 * once: one may hold it, however their reads and deletes interleave. Real files, hard links and all
 * (owner.test.ts covers file systems without them).
 */

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-takeover-'));
});
afterAll(() => rm(dir, { recursive: true, force: true }));

const here = ownerHere();
/** A process of this machine that no longer runs: above Linux's largest pid_max (2^22), no process has it. */
const DEAD = `${2 ** 22 + 1}${here.slice(here.indexOf('@'))}`;

describe('a lock whose owner was killed', () => {
  it('is taken over by exactly one of many takers at once, who leave nothing else behind', async () => {
    // Many rounds: without a takeover only one can win, two of 64 takers that read the dead owner before either deleted it both won in most rounds.
    for (let round = 0; round < 10; round++) {
      const file = path.join(dir, `lock-${round}`);
      await writeFile(file, DEAD);
      const taken = await Promise.all(Array.from({ length: 64 }, () => takeLock(file)));
      const winners = taken.filter((result) => 'release' in result);
      expect(winners, `round ${round}`).toHaveLength(1);
      expect(taken.filter((result) => 'heldBy' in result)).toEqual(Array(63).fill({ heldBy: here }));
      expect(await readFile(file, 'utf8')).toBe(here);
      for (const lock of winners) await lock.release();
    }
    expect(await readdir(dir)).toEqual([]);
  });

  it('is taken over where a takeover of it was killed halfway, and refused while a takeover runs', async () => {
    const file = path.join(dir, 'lock-model');
    await writeFile(file, DEAD);
    await writeFile(`${file}.takeover`, DEAD);
    const lock = await takeLock(file);
    expect('release' in lock).toBe(true);
    expect(await readdir(dir)).toEqual(['lock-model']);
    if ('release' in lock) await lock.release();

    // A process of another host counts as running.
    const running = '1@another-host';
    await writeFile(file, DEAD);
    await writeFile(`${file}.takeover`, running);
    expect(await takeLock(file)).toEqual({ heldBy: running });
    expect(await readFile(file, 'utf8')).toBe(DEAD);
  });
});
