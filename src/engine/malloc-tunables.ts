/**
 * glibc's malloc settings for the processes that run onnxruntime (the workers), which take effect only
 * in the environment a process starts with (GLIBC_TUNABLES, read by the dynamic loader before any of
 * its code runs): a worker gets them from the server as it is forked.
 *
 * Huge pages (glibc.malloc.hugetlb=1, glibc 2.35 and later): malloc asks the kernel for transparent huge
 * pages (madvise) for the blocks it maps. The VAE runs without onnxruntime's memory arena (so that a
 * worker does not keep a decode's gigabytes: providers.ts SessionTuning.memoryArena), which makes each of
 * a decode's activations a block mapped afresh and faulted in 4 KiB at a time; in 2 MiB pages the tiny
 * SDXL export's 1024x1024 decode took 1.5 s instead of 9.1, SD 1.5's at 512x512 0.58 s instead of 1.13,
 * the denoisers up to 16% less, and the memory still goes back to the system as each block is freed
 * (`npm run bench:session-memory` measures each export side by side; docs/performance.md). Where the
 * kernel's transparent huge pages are `never` the advice does nothing, and musl (Alpine) ignores
 * GLIBC_TUNABLES.
 */

const HUGE_PAGES = 'glibc.malloc.hugetlb';

/**
 * `tunables` (a GLIBC_TUNABLES value, `name=value` pairs joined by colons) with huge pages asked for,
 * unless it already says what malloc's huge pages are to be: a setting the environment gives wins.
 */
export function withHugePages(tunables: string | undefined): string {
  const entries = (tunables ?? '').split(':').filter((entry) => entry !== '');
  if (entries.some((entry) => entry.split('=')[0] === HUGE_PAGES)) return entries.join(':');
  return [...entries, `${HUGE_PAGES}=1`].join(':');
}

/** The environment a worker starts with: this process's, with huge pages where `hugePages`. */
export function workerEnvironment(hugePages: boolean, env: NodeJS.ProcessEnv = process.env): NodeJS.ProcessEnv {
  return hugePages ? { ...env, GLIBC_TUNABLES: withHugePages(env.GLIBC_TUNABLES) } : env;
}
