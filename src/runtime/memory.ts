import { writeFileSync } from 'node:fs';
import os from 'node:os';
import { cgroupAvailableBytes } from './cgroup-memory.js';
import { kernelText } from './kernel-files.js';

/**
 * What this process holds in memory and what the machine can still give, as the kernel counts them:
 * onnxruntime allocates natively, so Node's heap statistics see none of it. Linux /proc and cgroup
 * files where present (a container's limit is what the OOM killer enforces), portable figures elsewhere.
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
  const machine = procValue('/proc/meminfo', 'MemAvailable') ?? os.freemem();
  return Math.min(machine, cgroupAvailableBytes() ?? Infinity);
}
