import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { readFile } from 'node:fs/promises';
import { createInterface } from 'node:readline';
import type { Readable } from 'node:stream';
import { imagegenArgs, PROJECT_ROOT } from './cli.js';
import { TEST_SETTINGS } from './test-settings.js';

/**
 * `imagegen serve` as a process of its own (the built CLI, as `npm start` runs it), with only the
 * environment it is given, so that settings in the developer's environment cannot change a test.
 * For tests that kill, restart or put several servers behind a balancer.
 */

export interface ServerProcess {
  child: ChildProcess;
  /** http://127.0.0.1:<port>, and the API base URL (origin + /v1). */
  origin: string;
  baseURL: string;
  /** Resolves with the exit code (null when killed by a signal). */
  exited: Promise<number | null>;
  /** Everything it logged, one JSON object a line. */
  log: string[];
}

export interface SpawnOptions {
  /**
   * Resource limits of the process and its workers, in KiB: `fileSize` (ulimit -f), writes past it fail
   * with EFBIG as on a full disk; `data` (ulimit -d), allocations past it fail as on a machine out of memory.
   */
  limitsKb?: { fileSize?: number; data?: number };
  /** A control group's folder the process (and so its workers) joins before it starts (see helpers/cgroup.ts). */
  cgroup?: string;
  /** Each line of its log as it comes; `log` then keeps none (long runs, e.g. the soak benchmark). */
  onLine?(line: string): void;
  /** Its stderr: collected for the error of a failed start (default), or shown as it comes. */
  stderr?: 'pipe' | 'inherit';
  /** In a process group of its own (its pid is the group's id), as a shell or a service manager starts it. */
  group?: boolean;
  /** Flags after `serve`. */
  args?: string[];
}

/** Starts `imagegen serve` with `env` (over WORKERS=1 and TEST_SETTINGS) and resolves once it listens; rejects with its stderr when it exits first. */
export async function spawnServer(env: Record<string, string>, { limitsKb = {}, cgroup, onLine, stderr: stderrMode = 'pipe', group = false, args: flags = [] }: SpawnOptions = {}): Promise<ServerProcess> {
  const command = [process.execPath, ...imagegenArgs('serve', ...flags)];
  const setUp = [
    limitsKb.fileSize !== undefined && `ulimit -f ${limitsKb.fileSize}`,
    limitsKb.data !== undefined && `ulimit -d ${limitsKb.data}`,
    cgroup !== undefined && `echo $$ > '${cgroup}/cgroup.procs'`,
  ].filter(Boolean);
  const [file, ...args] = setUp.length === 0 ? command : ['bash', '-c', `${setUp.join(' && ')} && exec "$@"`, 'bash', ...command];
  const child = spawn(file, args, {
    cwd: PROJECT_ROOT,
    env: { PATH: process.env.PATH, HOME: process.env.HOME, WORKERS: '1', ...TEST_SETTINGS, ...env },
    stdio: ['ignore', 'pipe', stderrMode],
    detached: group,
  });
  const exited = once(child, 'exit').then(([code]) => code as number | null);
  const log: string[] = [];
  const hear = onLine ?? ((line: string) => log.push(line));
  let stderr = '';
  child.stderr?.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const url = await listeningUrl(child.stdout!, exited, () => new Error(`imagegen serve exited with ${child.exitCode ?? child.signalCode} before listening:\n${stderr}`), hear);
  return { child, baseURL: url, origin: url.replace(/\/v1$/, ''), exited, log };
}

/**
 * The API base URL `imagegen serve` says it listens on (its log's "imagegen listening" line, which names
 * the port it got when PORT is 0), read from its `stdout`; each line goes to `hear`. Rejects with
 * `failure()` when the server exits (`exited` settles) first.
 */
export function listeningUrl(stdout: Readable, exited: Promise<unknown>, failure: () => Error, hear: (line: string) => void = () => undefined): Promise<string> {
  const heard = new Promise<string>((resolve) => {
    // Every line is read, or the pipe would fill and block the server; only the one it waits for is parsed.
    createInterface({ input: stdout }).on('line', (line) => {
      hear(line);
      if (!line.includes('"imagegen listening"')) return;
      const entry = JSON.parse(line) as { msg?: string; url?: string };
      if (entry.msg === 'imagegen listening') resolve(entry.url!);
    });
  });
  return Promise.race([
    heard,
    exited.then(() => {
      throw failure();
    }),
  ]);
}

/** Kills the server at once (SIGKILL: no graceful shutdown, as a crash or an OOM kill) and waits for its exit. */
export async function killServer(server: ServerProcess): Promise<void> {
  if (server.child.exitCode === null && server.child.signalCode === null) server.child.kill('SIGKILL');
  await server.exited;
}

/**
 * The pids of the server's worker processes now: its children, which Linux lists in /proc under the
 * thread that started them (the main thread). Those of workers that ended are gone from the list.
 */
export async function workerProcesses(server: ServerProcess): Promise<number[]> {
  const pid = server.child.pid!;
  const children = await readFile(`/proc/${pid}/task/${pid}/children`, 'utf8');
  // None is '': not pid 0, which process.kill takes as this whole process group.
  return children.split(/\s+/).filter(Boolean).map(Number);
}
