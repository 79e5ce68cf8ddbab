import { spawnSync } from 'node:child_process';
import { workerEnvironment } from '../src/engine/malloc-tunables.js';

/** Set in the suite run again by runWithWorkerMalloc: the GLIBC_TUNABLES it was started with ('' for none). */
const STARTED_WITH = 'IMAGEGEN_BENCH_STARTED_GLIBC_TUNABLES';

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
  const { status, error } = spawnSync(process.execPath, [...process.execArgv, ...process.argv.slice(1)], {
    stdio: 'inherit',
    env: { ...env, [STARTED_WITH]: process.env.GLIBC_TUNABLES ?? '' },
  });
  if (error) throw error;
  process.exit(status ?? 1);
}

/**
 * The environment the suite was started with, for the processes that stand in for a server's clients
 * (the event-loop rows' requests and probes): their malloc is not the workers', and what the suite
 * does to measure its stages must not change what they measure.
 */
export function clientEnvironment(): NodeJS.ProcessEnv {
  const started = process.env[STARTED_WITH];
  if (started === undefined) return process.env;
  const env = { ...process.env };
  delete env[STARTED_WITH];
  if (started === '') delete env.GLIBC_TUNABLES;
  else env.GLIBC_TUNABLES = started;
  return env;
}
