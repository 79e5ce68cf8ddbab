import { existsSync } from 'node:fs';
import path from 'node:path';
import { kernelText } from './kernel-files.js';

/**
 * What this process's control groups still let it take: the OOM killer enforces a container's memory
 * limit whatever the machine has free. Both cgroup versions (v1 is still what many hosts run, this
 * project's CI machine among them), and every ancestor group, since a parent's limit binds its children.
 * Reclaimable page cache (inactive files) does not count as used.
 */

const ROOT = '/sys/fs/cgroup';
/** v1 writes "no limit" as the largest page-aligned 63-bit number. */
const UNLIMITED_V1 = 2 ** 62;

interface Hierarchy {
  /** The group's folder, then its ancestors' up to the mounted root. */
  dirs: string[];
  limitFile: string;
  usageFile: string;
  inactiveKey: string;
  /** The file whose `oom_kill` line counts the group's processes the OOM killer ended. */
  oomFile: string;
}

/**
 * A group's folder and its ancestors', innermost first, those that are mounted here: just the root
 * where the group's own is not (a container's namespace).
 */
function groupDirs(base: string, group: string, limitFile: string): string[] {
  const dirs: string[] = [];
  for (let dir = path.join(base, group); dir.startsWith(base); dir = path.dirname(dir)) {
    dirs.push(dir);
    if (dir === base) break;
  }
  return dirs.filter((dir) => existsSync(path.join(dir, limitFile)));
}

/** This process's memory hierarchy, from /proc/self/cgroup: the v1 memory controller's, else the v2 unified one. */
function findHierarchy(): Hierarchy | undefined {
  const lines = (kernelText('/proc/self/cgroup') ?? '').split('\n');
  // "id:controllers:path", the path itself possibly holding colons.
  const v1 = lines.map((line) => line.split(':')).find(([, controllers]) => controllers?.split(',').includes('memory'));
  if (v1) {
    const limitFile = 'memory.limit_in_bytes';
    return { dirs: groupDirs(path.join(ROOT, 'memory'), v1.slice(2).join(':'), limitFile), limitFile, usageFile: 'memory.usage_in_bytes', inactiveKey: 'total_inactive_file', oomFile: 'memory.oom_control' };
  }
  const v2 = lines.find((line) => line.startsWith('0::'));
  if (v2 && kernelText(path.join(ROOT, 'cgroup.controllers'))?.split(/\s+/).includes('memory')) {
    const limitFile = 'memory.max';
    return { dirs: groupDirs(ROOT, v2.slice(3), limitFile), limitFile, usageFile: 'memory.current', inactiveKey: 'inactive_file', oomFile: 'memory.events' };
  }
  return undefined;
}

/** A process stays in its group: found once (the plan reads the files on every batch). */
let found: { hierarchy?: Hierarchy } | undefined;
function hierarchy(): Hierarchy | undefined {
  found ??= { hierarchy: findHierarchy() };
  return found.hierarchy;
}

function numberIn(file: string): number | undefined {
  const text = kernelText(file)?.trim();
  if (!text || text === 'max') return undefined;
  const value = Number(text);
  return Number.isFinite(value) && value < UNLIMITED_V1 ? value : undefined;
}

function statValue(file: string, key: string): number | undefined {
  const match = new RegExp(`^${key} (\\d+)$`, 'm').exec(kernelText(file) ?? '');
  return match ? Number(match[1]) : undefined;
}

/** Bytes this process's groups still let it take (the least over the group and its ancestors); undefined where none limits it. */
export function cgroupAvailableBytes(): number | undefined {
  const h = hierarchy();
  if (!h) return undefined;
  let least: number | undefined;
  for (const dir of h.dirs) {
    const limit = numberIn(path.join(dir, h.limitFile));
    const usage = numberIn(path.join(dir, h.usageFile));
    if (limit === undefined || usage === undefined) continue;
    const used = Math.max(0, usage - (statValue(path.join(dir, 'memory.stat'), h.inactiveKey) ?? 0));
    least = Math.min(least ?? Infinity, Math.max(0, limit - used));
  }
  return least;
}

/**
 * Processes of this process's group the OOM killer has ended so far, by any OOM (the machine's or the
 * group's limit); undefined where the group's counter cannot be read (no cgroup, or a kernel before
 * 4.13). Unlike the machine's count (/proc/vmstat, not namespaced), it does not move when the killer
 * ends a process elsewhere, in another container.
 */
export function cgroupOomKills(): number | undefined {
  const h = hierarchy();
  const dir = h?.dirs[0];
  return dir ? statValue(path.join(dir, h.oomFile), 'oom_kill') : undefined;
}
