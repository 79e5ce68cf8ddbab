import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

/**
 * `imagegen serve` as its own process, run from source under tsx as in development, for benchmarks
 * that watch it from outside (its memory, its workers'). The worker pids come from its log, which
 * names each worker slot's process when it is ready.
 */

const REPO = fileURLToPath(new URL('..', import.meta.url));

export interface ServerProcess {
  pid: number;
  /** The API base URL, ending in /v1. */
  baseURL: string;
  /** The pid of each worker slot's latest process. */
  workerPids(): number[];
  /** Worker processes that started in a slot after its first one. */
  replacements(): number;
  /** SIGTERM, then waits for the exit (SIGKILL after 30 s). */
  stop(): Promise<void>;
}

interface LogLine {
  msg?: string;
  url?: string;
  worker?: number;
  pid?: number;
}

/** Starts the server on a free loopback port with `env` as its only settings and waits until /ready says ready. */
export async function startServerProcess(env: Record<string, string>): Promise<ServerProcess> {
  const child = spawn(process.execPath, ['--import', 'tsx', 'src/cli/main.ts', 'serve'], {
    cwd: REPO,
    // Only these settings: the developer's environment cannot change the measurement.
    env: { PATH: process.env.PATH, HOME: process.env.HOME, PORT: '0', MODELS_RESCAN_SECONDS: '0', LOG_LEVEL: 'info', ...env },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const exited = once(child, 'exit');
  const pids: number[] = [];
  let replacements = 0;
  const url = await new Promise<string>((resolve, reject) => {
    // Every line is read, or the pipe would fill and block the server; only these two are parsed.
    createInterface({ input: child.stdout! }).on('line', (line) => {
      if (!line.includes('"worker ready"') && !line.includes('"imagegen ready"')) return;
      const entry = JSON.parse(line) as LogLine;
      if (entry.msg === 'imagegen ready') resolve(entry.url!);
      if (entry.msg === 'worker ready') {
        if (pids[entry.worker!] !== undefined) replacements++;
        pids[entry.worker!] = entry.pid!;
      }
    });
    void exited.then(([code]) => reject(new Error(`imagegen serve exited with ${code} before listening`)));
  });
  const origin = url.replace(/\/v1$/, '');
  while ((await fetch(`${origin}/ready`)).status !== 200) await new Promise((resolve) => setTimeout(resolve, 50));
  return {
    pid: child.pid!,
    baseURL: url,
    workerPids: () => [...pids],
    replacements: () => replacements,
    async stop() {
      if (child.exitCode !== null) return;
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
      await exited;
      clearTimeout(timer);
    },
  };
}
