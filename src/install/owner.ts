import { randomUUID } from 'node:crypto';
import { readlinkSync } from 'node:fs';
import { link, open, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import { keepAfterExit, removeIfInterrupted } from './disk.js';

/**
 * Which process owns a thing in the staging area, and whether that process still runs, so that what a
 * killed install (kill -9, a crash, a power cut) left behind can be told from what a running one uses.
 * An owner is "<pid>@<machine>": a process of another machine (host, or container) sharing the models
 * folder cannot be checked from here, so it always counts as running.
 */

/**
 * Where a pid means one process: the host name (made safe for a file name: owners are part of staging
 * folders' names) and, on Linux, the PID namespace. Containers that share the host's name (host
 * networking, a Kubernetes hostNetwork pod beside the host) do not share their pids: by the name alone,
 * one would take the other's running install for a killed one, and delete its files.
 */
function machineName(): string {
  const host = os.hostname().replace(/[^A-Za-z0-9.-]/g, '_');
  const namespace = pidNamespace();
  return namespace ? `${host}-pidns${namespace}` : host;
}

/** The PID namespace's inode number (Linux: /proc/self/ns/pid is "pid:[4026531836]"), or undefined elsewhere. */
function pidNamespace(): string | undefined {
  try {
    return /\[(\d+)\]/.exec(readlinkSync('/proc/self/ns/pid'))?.[1];
  } catch {
    return undefined;
  }
}

const MACHINE = machineName();

export const ownerHere = (): string => `${process.pid}@${MACHINE}`;

/**
 * A name for a thing this process makes in the staging area (a staging folder, a lock's draft): `label`,
 * this process, and a UUID. The owner lets a later install remove what a killed one (kill -9, a crash)
 * left: its exit hook never ran, and an import's half copy or a replaced model moved aside may be
 * gigabytes that nothing else would ever delete.
 */
export const ownedName = (label: string): string => `${label}+${ownerHere()}+${randomUUID()}`;

/** The owner in a name made by ownedName; undefined for any other name. */
export const ownerOfName = (name: string): string | undefined => /\+([^+]+)\+[0-9a-f-]{36}$/.exec(name)?.[1];

/** Whether `owner` (ownerHere() of some process) names a process that still runs, or one that cannot be checked from here. */
export function ownerRuns(owner: string): boolean {
  const at = owner.indexOf('@');
  const pid = Number(owner.slice(0, at));
  if (at < 0 || !Number.isSafeInteger(pid) || pid <= 0) return false;
  if (owner.slice(at + 1) !== MACHINE) return true;
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    // EPERM: it runs, as another user.
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** A lock file held by this process; `release` deletes it (the exit hook does too, on Ctrl-C). */
export interface Lock {
  release(): Promise<void>;
}

/** What link fails with on a file system without hard links (FAT and exFAT, some network shares and FUSE file systems). */
const NO_HARD_LINKS = new Set(['EPERM', 'ENOTSUP', 'EOPNOTSUPP', 'ENOSYS']);

/**
 * Makes `file`, failing with EEXIST when it exists: a link to `draft`, which holds the owner already.
 * Where the file system has no hard links (a models folder on an exFAT drive, where every pull failed
 * with a bare EPERM), `file` is created exclusively and then written: in the moment between, another
 * process would read it empty and take it for a killed pull's.
 */
async function place(draft: string, file: string): Promise<void> {
  try {
    await link(draft, file);
  } catch (err) {
    if (!NO_HARD_LINKS.has((err as NodeJS.ErrnoException).code ?? '')) throw err;
    const handle = await open(file, 'wx');
    await handle
      .writeFile(ownerHere())
      .finally(() => handle.close())
      .catch(async (failed: unknown) => {
        await rm(file, { force: true });
        throw failed;
      });
  }
}

/**
 * Takes the lock file `file`, or returns the owner that holds it. The owner is written to a file of its
 * own and linked to `file`, so that the lock never exists without its owner (link fails when `file`
 * exists; see place for file systems without links). A lock whose owner no longer runs is taken over
 * (removeStale).
 */
export async function takeLock(file: string): Promise<Lock | { heldBy: string }> {
  // Named for this process: one killed before deleting it leaves it to the cleanup of the staging area.
  const draft = ownedName(file);
  try {
    // Inside the try: on a full disk the draft is created and its write fails.
    await writeFile(draft, ownerHere());
    for (;;) {
      try {
        await place(draft, file);
        removeIfInterrupted(file);
        // Out of the exit hook before it is deleted: deleted first, a Ctrl-C in between would delete the lock another pull took meanwhile.
        return {
          release: () => {
            keepAfterExit(file);
            return rm(file, { force: true });
          },
        };
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      }
      const holder = (await lockHolder(file)) ?? (await removeStale(file));
      if (holder !== undefined) return { heldBy: holder };
    }
  } finally {
    await rm(draft, { force: true });
  }
}

/**
 * Deletes the lock file `file` if its owner no longer runs; or returns the owner of a takeover of it under
 * way. Reading the owner and deleting the file are two steps: two processes that both read the same dead
 * owner would both delete, the later deleting the lock the earlier had just taken, and both would hold
 * it. So the deletion is made holding a second lock, which one process at a time holds, and the owner is
 * read again under it: while it is held nothing else deletes `file` (the dead owner cannot release it).
 * A takeover killed halfway leaves that second lock with a dead owner: it is taken over the same way.
 */
async function removeStale(file: string): Promise<string | undefined> {
  const takeover = await takeLock(`${file}.takeover`);
  if ('heldBy' in takeover) return takeover.heldBy;
  try {
    if ((await lockHolder(file)) === undefined) await rm(file, { force: true });
  } finally {
    await takeover.release();
  }
  return undefined;
}

/** Who holds the lock file `file`, if a running process does. */
export async function lockHolder(file: string): Promise<string | undefined> {
  const owner = await readFile(file, 'utf8').catch(() => undefined);
  return owner !== undefined && ownerRuns(owner) ? owner : undefined;
}
