import { existsSync, readFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { describe, expect, it, onTestFinished, vi } from 'vitest';
import { withHugePages, workerEnvironment } from '../src/engine/malloc-tunables.js';
import type { WorkerPool } from '../src/engine/pool.js';
import { withDemoPool } from './helpers/demo-pool.js';
import { demoBatch } from './helpers/demo-model.js';

describe("the workers' malloc tunables", () => {
  it('ask for huge pages beside the tunables given, unless those already say', () => {
    expect(withHugePages(undefined)).toBe('glibc.malloc.hugetlb=1');
    expect(withHugePages('')).toBe('glibc.malloc.hugetlb=1');
    expect(withHugePages('glibc.malloc.arena_max=2')).toBe('glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1');
    // A setting of the user's own wins, off or another mode.
    expect(withHugePages('glibc.malloc.hugetlb=0')).toBe('glibc.malloc.hugetlb=0');
    expect(withHugePages('glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2')).toBe('glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2');
    expect(workerEnvironment(false, { PATH: '/bin' })).toEqual({ PATH: '/bin' });
    expect(workerEnvironment(true, { PATH: '/bin', GLIBC_TUNABLES: 'glibc.malloc.arena_max=2' })).toEqual({ PATH: '/bin', GLIBC_TUNABLES: 'glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1' });
  });
});

/** The kernel's transparent huge pages mode, where it has them: `madvise` gives them to a process that asks. */
const THP = '/sys/kernel/mm/transparent_hugepage/enabled';
const thpMode = existsSync(THP) ? /\[(\w+)\]/.exec(readFileSync(THP, 'utf8'))?.[1] : undefined;
const thpSkip = thpMode === 'madvise' ? undefined : `the kernel's transparent huge pages are ${thpMode ?? 'absent'}, not given on request (madvise)`;
if (thpSkip) console.warn(`skipping the huge-page worker test: ${thpSkip}`);

/** KiB of a process's anonymous memory in transparent huge pages, and its environment's GLIBC_TUNABLES. */
async function hugePagesOf(pid: number): Promise<{ tunables: string | undefined; hugeKiB: number }> {
  const environ = (await readFile(`/proc/${pid}/environ`, 'utf8')).split('\0');
  const tunables = environ.find((entry) => entry.startsWith('GLIBC_TUNABLES='))?.slice('GLIBC_TUNABLES='.length);
  const rollup = await readFile(`/proc/${pid}/smaps_rollup`, 'utf8');
  return { tunables, hugeKiB: Number(/^AnonHugePages:\s+(\d+) kB$/m.exec(rollup)![1]) };
}

describe.skipIf(thpSkip !== undefined)(`a worker (${thpSkip ? `skipped: ${thpSkip}` : 'transparent huge pages on request'})`, () => {
  /** A 512x512 demo image made by a pool's worker, which keeps its denoiser's arena: the worker's huge pages after. */
  const afterAnImage = async (pool: WorkerPool) => {
    await pool.generate(demoBatch({ width: 512, height: 512, steps: 2 }));
    return hugePagesOf(pool.workers()[0].pid!);
  };

  it('holds its arenas in huge pages by default, and in none with MALLOC_HUGE_PAGES off (glibc, which reads its tunables as the worker starts)', async () => {
    // The test's own environment (vitest.config.ts) asks for them: the worker that must not have them
    // starts without, as it would from a server whose environment says nothing.
    vi.stubEnv('GLIBC_TUNABLES', undefined);
    onTestFinished(() => void vi.unstubAllEnvs());
    let on: Awaited<ReturnType<typeof hugePagesOf>> | undefined;
    let off: Awaited<ReturnType<typeof hugePagesOf>> | undefined;
    await withDemoPool(async (pool) => {
      on = await afterAnImage(pool);
    });
    await withDemoPool(
      async (pool) => {
        off = await afterAnImage(pool);
      },
      { mallocHugePages: false },
    );
    expect(on!.tunables).toBe('glibc.malloc.hugetlb=1');
    expect(on!.hugeKiB).toBeGreaterThanOrEqual(2048);
    expect(off).toEqual({ tunables: undefined, hugeKiB: 0 });
  });
});
