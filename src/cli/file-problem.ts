/**
 * A system error on a file or folder, in words that say what to do. Node's own name the call that failed
 * ("EACCES: permission denied, mkdir '/srv/models/.staging'"), not the remedy; a models command meets
 * them on a folder it may not write (another user's, a read-only disk) or a file where a folder belongs.
 */

/** What the failed call was doing to the path, in a user's words. */
const VERBS: Record<string, string> = {
  mkdir: 'create',
  open: 'open',
  scandir: 'list',
  opendir: 'list',
  rename: 'move',
  rm: 'remove',
  rmdir: 'remove',
  unlink: 'remove',
  copyfile: 'copy',
};

/** The message for a system error `err` on a file or folder, or undefined when it is none of those with a known remedy. */
export function fileProblem(err: NodeJS.ErrnoException): string | undefined {
  const file = err.path ?? 'a file';
  const doing = `${VERBS[err.syscall ?? ''] ?? 'use'} ${file}`;
  switch (err.code) {
    case 'EACCES':
    case 'EPERM':
      return `no permission to ${doing} (${err.code}): run imagegen as a user who may (the folder's owner), give this user access to it (chown, chmod), or choose another folder`;
    case 'EROFS':
      return `cannot ${doing}: its file system is read-only (EROFS): remount it writable, or choose a folder on another disk`;
    // mkdir's where the path is a file (util/files.ts makeFolder words it so too), or any call's where a folder on it is.
    case 'EEXIST':
    case 'ENOTDIR':
      return `cannot ${doing}: a file is in the way, where a folder is needed (it, or a folder on its path, is a file; ${err.code}): name a folder, not a file`;
    default:
      return undefined;
  }
}
