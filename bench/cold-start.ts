import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { listeningUrl } from '../test/helpers/server-process.js';
import type { Row } from './report.js';
import { median, ms } from './stats.js';

/**
 * Cold start (issue #17): how long `npm start` on a built tree takes to answer /health, against the
 * server alone (`node dist/cli/main.js serve`), taking turns. `npm start`'s prestart builds only when a
 * source changed (scripts/build-if-stale.mjs): here nothing has, so what it adds is npm itself.
 */

const REPO = fileURLToPath(new URL('..', import.meta.url));
const ROUNDS = 3;

/** SIGTERM to a process group; none left in it (the server exited by itself) is nothing to stop. */
function stopGroup(leader: number): void {
  try {
    process.kill(-leader, 'SIGTERM');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ESRCH') throw err;
  }
}

/** Milliseconds from spawning `command` to its first /health 200; then stops it (the whole process group). */
async function untilHealthy(command: string[], dataDir: string): Promise<number> {
  const started = performance.now();
  // PORT 0: it binds a port free then and says which (no other process can take it in between), as
  // the address it listens on unless PUBLIC_BASE_URL names another, so none is passed on.
  // LOG_LEVEL info: the port comes from the info line "imagegen listening", which a developer's LOG_LEVEL=warn would silence.
  const env = { ...process.env, PORT: '0', PUBLIC_BASE_URL: undefined, DATA_DIR: dataDir, PRELOAD: 'none', LOG_LEVEL: 'info' };
  const child = spawn(command[0], command.slice(1), { cwd: REPO, env, stdio: ['ignore', 'pipe', 'ignore'], detached: true });
  const exited = once(child, 'exit');
  // In a group of its own, so that npm's children stop with it, the server gets none of the signals a
  // terminal's Ctrl-C sends to the benchmark's group: passed on, or the run's end would leave it serving.
  const stopWithUs = (signal: NodeJS.Signals) => {
    stopGroup(child.pid!);
    process.exit(128 + os.constants.signals[signal]);
  };
  process.once('SIGINT', stopWithUs);
  process.once('SIGTERM', stopWithUs);
  const failed = () => new Error(`${command.join(' ')} exited with ${child.exitCode} before answering /health`);
  try {
    const api = await listeningUrl(child.stdout!, exited, failed);
    const health = new URL('/health', api);
    for (;;) {
      const ok = await fetch(health).then((res) => res.ok, () => false);
      if (ok) return performance.now() - started;
      if (child.exitCode !== null) throw failed();
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  } finally {
    process.off('SIGINT', stopWithUs);
    process.off('SIGTERM', stopWithUs);
    stopGroup(child.pid!);
    await exited;
  }
}

export async function measureColdStart(): Promise<Row[]> {
  const dataDir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-cold-'));
  try {
    // Built and stamped, as a tree is after `npm ci && npm start` once.
    await once(spawn('node', ['scripts/build-if-stale.mjs'], { cwd: REPO, stdio: 'inherit' }), 'exit');
    const alone: number[] = [];
    const npm: number[] = [];
    for (let round = 0; round < ROUNDS; round++) {
      alone.push(await untilHealthy(['node', 'dist/cli/main.js', 'serve'], dataDir));
      npm.push(await untilHealthy(['npm', 'start', '--silent'], dataDir));
    }
    const [baseline, measured] = [median(alone), median(npm)];
    return [
      {
        group: 'cold start',
        case: 'npm start on a built tree to /health; baseline: node dist/cli/main.js serve',
        baseline: ms(baseline),
        measured: ms(measured),
        ratio: measured / baseline,
        goal: '<= 2000 ms',
        met: measured <= 2000,
      },
    ];
  } finally {
    await rm(dataDir, { recursive: true, force: true });
  }
}
