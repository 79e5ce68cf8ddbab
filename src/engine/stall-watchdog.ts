import type { WorkerProcess } from './worker-process.js';

/** A watchdog's handle: each sign of progress restarts its clock; stop() ends it. */
export interface StallWatchdog {
  progress(): void;
  stop(): void;
}

/**
 * Kills `worker` once it goes `limitMs` without progress() (never with a limit of 0), not counting time
 * during which `excused()` says it is waiting for something else (memory other batches planned on):
 * a deadlock in native code would otherwise hold its batch, or a starting worker, forever. `doing`
 * says what it was at, for the kill's reason.
 */
export function stallWatchdog(worker: WorkerProcess, limitMs: number, excused: () => boolean, doing = ''): StallWatchdog {
  let timer: NodeJS.Timeout | undefined;
  const progress = () => {
    clearTimeout(timer);
    if (limitMs > 0) timer = setTimeout(() => (excused() ? progress() : worker.kill(`made no progress for ${limitMs / 1000} s${doing} and was killed`)), limitMs);
  };
  progress();
  return { progress, stop: () => clearTimeout(timer) };
}
