import { mkdtemp, readFile, rmdir, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import path from 'node:path';

/**
 * A memory control group of its own for a test's processes, so that the kernel's OOM killer acts
 * within a limit the test sets rather than on the whole machine. Needs root and a writable cgroup
 * mount: the v1 memory controller (/sys/fs/cgroup/memory), or v2 with the memory controller enabled for
 * children of the root.
 */

export interface MemoryCgroup {
  dir: string;
  remove(): Promise<void>;
}

/** The folder new groups go in, or why there is none. */
function parent(): { dir: string; limitFile: string } | { skip: string } {
  if (process.getuid?.() !== 0) return { skip: 'creating a memory cgroup needs root' };
  if (existsSync('/sys/fs/cgroup/memory/cgroup.procs')) return { dir: '/sys/fs/cgroup/memory', limitFile: 'memory.limit_in_bytes' };
  if (existsSync('/sys/fs/cgroup/cgroup.subtree_control')) return { dir: '/sys/fs/cgroup', limitFile: 'memory.max' };
  return { skip: 'no cgroup memory controller is mounted at /sys/fs/cgroup' };
}

/** Why memory cgroups cannot be made here, or undefined when they can. */
export async function cgroupUnavailable(): Promise<string | undefined> {
  const where = parent();
  if ('skip' in where) return where.skip;
  try {
    const group = await makeMemoryCgroup(64 * 2 ** 20);
    await group.remove();
    return undefined;
  } catch (err) {
    return `cannot make a memory cgroup: ${(err as Error).message}`;
  }
}

/** A new group limited to `limitBytes`; remove() once its processes have ended. */
export async function makeMemoryCgroup(limitBytes: number): Promise<MemoryCgroup> {
  const where = parent();
  if ('skip' in where) throw new Error(where.skip);
  if (where.limitFile === 'memory.max' && !(await readFile(path.join(where.dir, 'cgroup.subtree_control'), 'utf8')).includes('memory')) {
    throw new Error('the v2 memory controller is not enabled for child groups');
  }
  const dir = await mkdtemp(path.join(where.dir, 'imagegen-test-'));
  const limit = String(Math.round(limitBytes));
  try {
    await writeFile(path.join(dir, where.limitFile), limit);
    // Without swap in the limit too, a machine with swap would page instead of reaching the OOM killer.
    const swapFile = where.limitFile === 'memory.max' ? ['memory.swap.max', '0'] : ['memory.memsw.limit_in_bytes', limit];
    if (existsSync(path.join(dir, swapFile[0]))) await writeFile(path.join(dir, swapFile[0]), swapFile[1]);
  } catch (err) {
    await rmdir(dir);
    throw err;
  }
  const members = async () => (await readFile(path.join(dir, 'cgroup.procs'), 'utf8')).split('\n').filter(Boolean).map(Number);
  return {
    dir,
    // A group can go only once its last process has: killed workers take a moment to exit, and any left
    // after that are killed.
    async remove() {
      for (let tries = 0; (await members()).length && tries < 100; tries++) await new Promise((resolve) => setTimeout(resolve, 50));
      for (const pid of await members()) process.kill(pid, 'SIGKILL');
      for (let tries = 0; (await members()).length && tries < 100; tries++) await new Promise((resolve) => setTimeout(resolve, 50));
      await rmdir(dir);
    },
  };
}
