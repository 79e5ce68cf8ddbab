import { writeFileSync } from 'node:fs';
import os from 'node:os';
import { cgroupAvailableBytes } from './cgroup-memory.js';
import { darwinAvailableBytes } from './darwin-memory.js';
import { kernelText } from './kernel-files.js';

/**
 * What this process holds in memory and what the machine can still give, as the kernel counts them:
 * onnxruntime allocates natively, so Node's heap statistics see none of it. Linux /proc and cgroup
 * files where present (a container's limit is what the OOM killer enforces), `vm_stat` on macOS,
 * portable figures elsewhere.
 */

function procValue(file: string, key: string): number | undefined {
  const match = new RegExp(`^${key}:\\s+(\\d+) kB$`, 'm').exec(kernelText(file) ?? '');
  return match ? Number(match[1]) * 1024 : undefined;
}

/** Resident memory of this process now. */
export function residentBytes(): number {
  return process.memoryUsage.rss();
}

/**
 * Resident memory of this process once its garbage is collected. Loading a model leaves garbage that
 * V8 frees when it likes: a rewritten graph's bytes (up to its file's size, see graph-rewrite.ts) once
 * onnxruntime has copied them; counted, they would be taken for the model's. Where the process runs
 * with --expose-gc, as workers do (worker-process.ts), this collects (collectGarbage), then waits for
 * the memory to be given back. V8 frees large buffers on a background thread after a collection, so
 * after one memory goes on falling for tens of milliseconds (a 100 MiB graph measured 226 MiB
 * uncollected, 188 right after the collection, 126 once settled, as when onnxruntime reads the file
 * itself), and a loaded machine that kept that thread from running past the polls below counted the
 * garbage as the model's; a second collection finishes the first one's freeing before it starts (200
 * MiB of freed buffers: 60 to 180 MiB still resident after one, none after two). Elsewhere (the CLI)
 * it is residentBytes().
 */
export async function settledResidentBytes(): Promise<number> {
  if (!collectGarbage()) return residentBytes();
  let last = residentBytes();
  let still = 0;
  for (let waited = 0; waited < SETTLE.maxMs; waited += SETTLE.pollMs) {
    await new Promise((resolve) => setTimeout(resolve, SETTLE.pollMs));
    const now = residentBytes();
    still = last - now < SETTLE.stillBytes ? still + 1 : 0;
    if (still === SETTLE.stillPolls) return now;
    last = now;
  }
  return last;
}

/**
 * Collects this process's garbage and gives back the memory of what it freed before returning (see
 * settledResidentBytes for why twice); false, doing nothing, where the process runs without --expose-gc.
 */
export function collectGarbage(): boolean {
  if (!globalThis.gc) return false;
  globalThis.gc();
  globalThis.gc();
  return true;
}

/**
 * How settledResidentBytes waits: polls until resident memory falls by less than stillBytes between
 * polls, stillPolls times in a row. Once was not enough on a loaded machine (load 15 on 2 cores): the
 * thread that frees the buffers had not run between two polls, and a 100 MiB graph's load measured
 * 322 MiB where settled it is 131. It runs as a model loads, so waiting a little longer costs nothing.
 */
const SETTLE = { pollMs: 20, maxMs: 1000, stillPolls: 3, stillBytes: 1024 ** 2 };

/**
 * Starts a new peak measurement: Linux resets the process's high-water mark (VmHWM) when "5" is written
 * to clear_refs. False where it cannot, and then peakBytes() is the peak since the process started.
 */
export function resetPeak(): boolean {
  try {
    writeFileSync('/proc/self/clear_refs', '5');
    return true;
  } catch {
    return false;
  }
}

/** The most resident memory this process held since resetPeak() (or since it started). */
export function peakBytes(): number {
  return procValue('/proc/self/status', 'VmHWM') ?? process.resourceUsage().maxRSS * 1024;
}

/** Share of the free memory batches may plan to use: the server, the workers' other allocations and the OS move too. */
export const HEADROOM = 0.9;

/** What batches may plan to take now: HEADROOM of what is free, and no more than that of `limit` (MEMORY_LIMIT). */
export function plannableBytes(limit = Infinity): number {
  return Math.min(availableBytes(), limit) * HEADROOM;
}

/** Resident memory of another process of this machine (a worker), where /proc shows it. */
export function residentBytesOf(pid: number): number | undefined {
  return procValue(`/proc/${pid}/status`, 'VmRSS');
}

/** Memory the machine (or this process's container, see cgroup-memory.ts) can still give before something is killed. */
export function availableBytes(): number {
  const machine = procValue('/proc/meminfo', 'MemAvailable') ?? (process.platform === 'darwin' ? darwinAvailableBytes() : undefined) ?? os.freemem();
  return Math.min(machine, cgroupAvailableBytes() ?? Infinity);
}
