import { spawnServer } from '../test/helpers/server-process.js';

/**
 * `imagegen serve` as its own process, run from source under tsx as in development, for benchmarks
 * that watch it from outside (its memory, its workers'). The worker pids come from its log, which
 * names each worker slot's process when it is ready.
 */

export interface ServerProcess {
  pid: number;
  /** The API base URL, ending in /v1, and the origin. */
  baseURL: string;
  origin: string;
  /** The pid of each worker slot's latest process. */
  workerPids(): number[];
  /** Worker processes that started in a slot after its first one. */
  replacements(): number;
  /** SIGTERM, then waits for the exit (SIGKILL after 30 s). */
  stop(): Promise<void>;
}

interface LogLine {
  worker?: number;
  workerPid?: number;
}

/** Starts the server on a free loopback port with `env` as its only settings and waits until /ready says ready. */
export async function startServerProcess(env: Record<string, string>): Promise<ServerProcess> {
  const pids: number[] = [];
  let replacements = 0;
  const server = await spawnServer(
    { PORT: '0', MODELS_RESCAN_SECONDS: '0', LOG_LEVEL: 'info', ...env },
    {
      stderr: 'inherit',
      // Only the workers' lines are parsed: a soak run logs tens of thousands of others.
      onLine(line) {
        if (!line.includes('"worker ready"')) return;
        const entry = JSON.parse(line) as LogLine;
        if (pids[entry.worker!] !== undefined) replacements++;
        pids[entry.worker!] = entry.workerPid!;
      },
    },
  );
  while ((await fetch(`${server.origin}/ready`)).status !== 200) await new Promise((resolve) => setTimeout(resolve, 50));
  const { child } = server;
  return {
    pid: child.pid!,
    baseURL: server.baseURL,
    origin: server.origin,
    workerPids: () => [...pids],
    replacements: () => replacements,
    async stop() {
      if (child.exitCode !== null) return;
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
      await server.exited;
      clearTimeout(timer);
    },
  };
}
