import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { accessSync, constants } from 'node:fs';
import { createServer, connect } from 'node:net';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

/**
 * The standard parts a cluster of replicas runs beside them, started as real processes for the tests:
 * Debian's redis-server and haproxy, and s3rver (an S3-wire-compatible server from npm, a dev
 * dependency) standing in for the object store. Each helper resolves once its process serves, and
 * stop() ends it and waits for its exit.
 */

const REPO = fileURLToPath(new URL('../..', import.meta.url));

/** The executable `name` on PATH or in the sbin folders (where Debian puts haproxy), or undefined. */
export function findCommand(name: string): string | undefined {
  const dirs = [...(process.env.PATH ?? '').split(path.delimiter), '/usr/sbin', '/usr/local/sbin', '/sbin'];
  for (const dir of dirs.filter(Boolean)) {
    const file = path.join(dir, name);
    try {
      accessSync(file, constants.X_OK);
      return file;
    } catch {
      // not in this folder
    }
  }
  return undefined;
}

/** A TCP port free on loopback right now (for processes that cannot report the one they picked). */
export async function freePort(): Promise<number> {
  const server = createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const address = server.address();
  server.close();
  if (typeof address !== 'object' || !address) throw new Error('no port');
  return address.port;
}

/** Resolves once something accepts connections on `port`. */
async function untilListening(port: number, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const open = await new Promise<boolean>((resolve) => {
      const socket = connect(port, '127.0.0.1', () => resolve(true)).on('error', () => resolve(false));
      socket.unref();
      setTimeout(() => socket.destroy(), 200).unref();
    });
    if (open) return;
    if (Date.now() > deadline) throw new Error(`nothing listens on port ${port} after ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

export interface Service {
  child: ChildProcess;
  /** Everything it printed. */
  output: string[];
  /** Ends it (SIGTERM, SIGKILL after 5 s) and waits for its exit. */
  stop(): Promise<void>;
}

function startProcess(command: string, args: string[], env: Record<string, string> = {}): Service {
  const child = spawn(command, args, { cwd: REPO, env: { PATH: process.env.PATH, HOME: process.env.HOME, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  const output: string[] = [];
  for (const stream of [child.stdout!, child.stderr!]) createInterface({ input: stream }).on('line', (line) => output.push(line));
  const exited = once(child, 'exit');
  return {
    child,
    output,
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
      await exited;
      clearTimeout(timer);
    },
  };
}

/** Waits for a line matching `pattern`; rejects with the output when the process exits first. */
async function untilLine(service: Service, pattern: RegExp, what: string): Promise<RegExpExecArray> {
  const deadline = Date.now() + 15_000;
  for (;;) {
    for (const line of service.output) {
      const match = pattern.exec(line);
      if (match) return match;
    }
    if (service.child.exitCode !== null) throw new Error(`${what} exited with ${service.child.exitCode}:\n${service.output.join('\n')}`);
    if (Date.now() > deadline) throw new Error(`${what} did not start:\n${service.output.join('\n')}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

export interface RedisService extends Service {
  url: string;
}

/**
 * A throw-away redis-server on loopback, keeping nothing on disk. It cannot report a port it picked, so
 * it gets one free a moment before: should another process (a connection's local port, on a busy
 * machine) take it meanwhile, it tries another.
 */
export async function startRedis(binary: string): Promise<RedisService> {
  for (let tries = 1; ; tries++) {
    const port = await freePort();
    const service = startProcess(binary, ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no']);
    try {
      await untilLine(service, /Ready to accept connections/, 'redis-server');
      return { ...service, url: `redis://127.0.0.1:${port}/0` };
    } catch (err) {
      if (tries === 3 || !service.output.some((line) => line.includes('Address already in use'))) throw err;
    }
  }
}

export interface S3Service extends Service {
  /** The S3 API's address (path-style buckets). */
  endpoint: string;
  /** Credentials s3rver accepts, given to the servers as the standard AWS variables. */
  credentials: { AWS_ACCESS_KEY_ID: string; AWS_SECRET_ACCESS_KEY: string; AWS_REGION: string };
}

/** s3rver with one bucket, `bucket`, keeping its objects in `dir`; `port` 0 picks one (a restart passes the old one). */
export async function startS3Server(dir: string, bucket: string, port = 0): Promise<S3Service> {
  const bin = path.join(REPO, 'node_modules', 's3rver', 'bin', 's3rver.js');
  const service = startProcess(process.execPath, [bin, '--directory', dir, '--address', '127.0.0.1', '--port', String(port), '--configure-bucket', bucket]);
  const [, listening] = await untilLine(service, /S3rver listening on (\S+)/, 's3rver');
  return {
    ...service,
    endpoint: `http://${listening}`,
    credentials: { AWS_ACCESS_KEY_ID: 'S3RVER', AWS_SECRET_ACCESS_KEY: 'S3RVER', AWS_REGION: 'us-east-1' },
  };
}

export interface HaproxyService extends Service {
  /** The balancer's origin. */
  origin: string;
  /** Each server's status as HAProxy's stats page says it (UP, DOWN, ...), by name; the backups used when none is ready are left out. */
  servers(): Promise<Record<string, string>>;
}

/** HAProxy with deploy/haproxy.cfg, the documented configuration, in front of `replicas` (host:port each). */
export async function startHaproxy(binary: string, replicas: [string, string], env: Record<string, string> = {}): Promise<HaproxyService> {
  const [port, statsPort] = [await freePort(), await freePort()];
  const service = startProcess(binary, ['-db', '-f', 'deploy/haproxy.cfg'], {
    HAPROXY_BIND: `127.0.0.1:${port}`,
    HAPROXY_STATS_BIND: `127.0.0.1:${statsPort}`,
    REPLICA1: replicas[0],
    REPLICA2: replicas[1],
    ...env,
  });
  await untilListening(port).catch((err: Error) => {
    throw new Error(`${err.message}; haproxy said:\n${service.output.join('\n')}`);
  });
  return {
    ...service,
    origin: `http://127.0.0.1:${port}`,
    async servers() {
      const csv = await (await fetch(`http://127.0.0.1:${statsPort}/stats;csv`)).text();
      const [header, ...rows] = csv.replace(/^# /, '').trim().split('\n').map((line) => line.split(','));
      const [name, status, backup] = [header.indexOf('svname'), header.indexOf('status'), header.indexOf('bck')];
      return Object.fromEntries(rows.filter((row) => row[0] === 'replicas' && !['BACKEND', 'FRONTEND'].includes(row[name]) && row[backup] !== '1').map((row) => [row[name], row[status]]));
    },
  };
}
