import { spawnSync } from 'node:child_process';
import { workerEnvironment } from '../src/engine/malloc-tunables.js';

/**
 * Runs this benchmark again in a process whose malloc is set as the server's workers' is by default
 * (huge pages: src/engine/malloc-tunables.ts), unless this one's already is, and exits with its status.
 * The in-process measurements (the pipelines' stages, HTTP's in-process baselines) must allocate as the
 * workers do, or they time other work than a server does (a VAE decode took up to 6 times as long) and
 * compare unlike with like. glibc reads its tunables only as a process starts: hence a second process.
 */
export function runWithWorkerMalloc(): void {
  const env = workerEnvironment(true);
  if (env.GLIBC_TUNABLES === process.env.GLIBC_TUNABLES) return;
  const { status, error } = spawnSync(process.execPath, [...process.execArgv, ...process.argv.slice(1)], { stdio: 'inherit', env });
  if (error) throw error;
  process.exit(status ?? 1);
}
