import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { accessSync, constants, readFileSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { createServer, type AddressInfo, type Server } from 'node:net';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

/**
 * The standard parts a cluster of replicas runs beside them, started as real processes for the tests:
 * Debian's redis-server, haproxy and nginx, and s3rver (an S3-wire-compatible server from npm, a dev
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

/** Below this, the ports services are commonly set up on (databases, web servers): freePorts picks none there. */
const COMMON_PORTS_END = 10_000;

/**
 * Where freePorts picks: below the ports the kernel hands out by itself (Linux's ip_local_port_range), to
 * a listener asking for port 0 and to a connection's local end. A service stopped and started again on
 * its port (where its clients look) then finds it free: one of those, the kernel could give to whatever
 * asked it for a port while the service was down (another test file's server, a connection). Undefined
 * where the range is not known (no /proc) or leaves no room below it: the kernel then picks (port 0).
 */
function portsOfOurOwn(): { from: number; to: number } | undefined {
  let low: number;
  try {
    low = Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]);
  } catch {
    return undefined;
  }
  return low > COMMON_PORTS_END ? { from: COMMON_PORTS_END, to: low } : undefined;
}

/** `count` distinct TCP ports free on loopback right now (each held until all are found, so none repeats), at random from portsOfOurOwn(). */
async function freePorts(count: number): Promise<number[]> {
  const range = portsOfOurOwn();
  const servers: Server[] = [];
  try {
    while (servers.length < count) {
      const server = createServer();
      try {
        await once(server.listen(range ? range.from + Math.floor(Math.random() * (range.to - range.from)) : 0, '127.0.0.1'), 'listening');
        servers.push(server);
      } catch (err) {
        // Taken (by a service of this machine, or a pick of another test file's): another pick.
        if ((err as NodeJS.ErrnoException).code !== 'EADDRINUSE') throw err;
      }
    }
    return servers.map((server) => (server.address() as AddressInfo).port);
  } finally {
    for (const server of servers) server.close();
  }
}

/**
 * Starts a process that must be told its ports (it cannot bind port 0 and say which one it got, as
 * `imagegen serve` can, or must keep them for a restart) on `count` ports found free a moment before.
 * Should another process take one meanwhile (another test file's pick, on a busy machine), the process
 * says that its port is already in use (redis-server, haproxy, s3rver and imagegen serve all do) and
 * exits, and `start`'s error, holding its output, says so: then it tries again on new ports. Three
 * tries, then that error.
 */
async function onFreePorts<T>(count: number, start: (ports: number[]) => Promise<T>): Promise<T> {
  for (let tries = 1; ; tries++) {
    try {
      return await start(await freePorts(count));
    } catch (err) {
      if (tries === 3 || !/already in use/i.test((err as Error).message)) throw err;
    }
  }
}

/** Starts a service on `port` (one started again where its clients look), or on one found free (see onFreePorts). */
export function startOn<T>(port: number | undefined, start: (port: number) => Promise<T>): Promise<T> {
  return port === undefined ? onFreePorts(1, ([free]) => start(free)) : start(port);
}

export interface Service {
  child: ChildProcess;
  /** Everything it printed. */
  output: string[];
  /** Whether it has exited and everything it printed has been read. */
  ended(): boolean;
  /** Ends it (SIGTERM, SIGKILL after 5 s) and waits for its exit. */
  stop(): Promise<void>;
}

function startProcess(command: string, args: string[], env: Record<string, string> = {}): Service {
  const child = spawn(command, args, { cwd: REPO, env: { PATH: process.env.PATH, HOME: process.env.HOME, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  const output: string[] = [];
  for (const stream of [child.stdout!, child.stderr!]) createInterface({ input: stream }).on('line', (line) => output.push(line));
  const exited = once(child, 'exit');
  // 'close' comes once its output is read too: the lines saying why it exited are then in `output`.
  let ended = false;
  child.on('close', () => (ended = true));
  return {
    child,
    output,
    ended: () => ended,
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
      await exited;
      clearTimeout(timer);
    },
  };
}

/**
 * Waits until `ready` finds the process serving (it answers what it found); rejects with its output when
 * it exits first, or stops it and rejects when 15 s pass.
 */
async function until<T>(service: Service, what: string, ready: () => Promise<T | undefined>): Promise<T> {
  const deadline = Date.now() + 15_000;
  for (;;) {
    const found = await ready();
    if (found !== undefined) return found;
    if (service.ended()) throw new Error(`${what} exited with ${service.child.exitCode}:\n${service.output.join('\n')}`);
    if (Date.now() > deadline) {
      await service.stop();
      throw new Error(`${what} did not start:\n${service.output.join('\n')}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** Waits for a line matching `pattern` (see until). */
function untilLine(service: Service, pattern: RegExp, what: string): Promise<RegExpExecArray> {
  return until(service, what, async () => {
    for (const line of service.output) {
      const match = pattern.exec(line);
      if (match) return match;
    }
    return undefined;
  });
}

export interface RedisService extends Service {
  url: string;
}

/**
 * A throw-away redis-server on loopback, keeping nothing on disk, on a port found free (see onFreePorts),
 * or on `port` (a Redis started again where its clients look).
 */
export function startRedis(binary: string, port?: number): Promise<RedisService> {
  const start = async (on: number): Promise<RedisService> => {
    const service = startProcess(binary, ['--port', String(on), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no']);
    await untilLine(service, /Ready to accept connections/, 'redis-server');
    return { ...service, url: `redis://127.0.0.1:${on}/0` };
  };
  return startOn(port, start);
}

export interface S3Service extends Service {
  /** The S3 API's address (path-style buckets). */
  endpoint: string;
  /** Credentials s3rver accepts, given to the servers as the standard AWS variables. */
  credentials: { AWS_ACCESS_KEY_ID: string; AWS_SECRET_ACCESS_KEY: string; AWS_REGION: string };
}

/** s3rver with one bucket, `bucket`, keeping its objects in `dir`, on a port found free (see onFreePorts), or on `port` (a restart passes the old one). */
export function startS3Server(dir: string, bucket: string, port?: number): Promise<S3Service> {
  const bin = path.join(REPO, 'node_modules', 's3rver', 'bin', 's3rver.js');
  return startOn(port, async (on) => {
    const service = startProcess(process.execPath, [bin, '--directory', dir, '--address', '127.0.0.1', '--port', String(on), '--configure-bucket', bucket]);
    const [, listening] = await untilLine(service, /S3rver listening on (\S+)/, 's3rver');
    return {
      ...service,
      endpoint: `http://${listening}`,
      credentials: { AWS_ACCESS_KEY_ID: 'S3RVER', AWS_SECRET_ACCESS_KEY: 'S3RVER', AWS_REGION: 'us-east-1' },
    };
  });
}

export interface HaproxyService extends Service {
  /** The balancer's origin. */
  origin: string;
  /** Each server's status as HAProxy's stats page says it (UP, DOWN, ...), by name; the backups used when none is ready are left out. */
  servers(): Promise<Record<string, string>>;
}

/** HAProxy's stats page as CSV, from its stats listener on `statsPort`. */
async function statsCsv(statsPort: number, signal?: AbortSignal): Promise<string> {
  return (await fetch(`http://127.0.0.1:${statsPort}/stats;csv`, { signal })).text();
}

/**
 * HAProxy with deploy/haproxy.cfg, the documented configuration, in front of `replicas` (host:port each),
 * on ports found free (see onFreePorts: HAProxy refuses port 0).
 */
export function startHaproxy(binary: string, replicas: [string, string], env: Record<string, string> = {}): Promise<HaproxyService> {
  return onFreePorts(2, async ([port, statsPort]) => {
    const service = startProcess(binary, ['-db', '-f', 'deploy/haproxy.cfg'], {
      HAPROXY_BIND: `127.0.0.1:${port}`,
      HAPROXY_STATS_BIND: `127.0.0.1:${statsPort}`,
      REPLICA1: replicas[0],
      REPLICA2: replicas[1],
      ...env,
    });
    // Its own stats page, not merely something accepting connections on the port (which another process
    // that took it would): HAProxy binds every listener before it serves any, and exits if one fails.
    await until(service, 'haproxy', () => statsCsv(statsPort, AbortSignal.timeout(5000)).then((csv) => (csv.startsWith('# pxname') ? csv : undefined), () => undefined));
    return {
      ...service,
      origin: `http://127.0.0.1:${port}`,
      async servers() {
        const [header, ...rows] = (await statsCsv(statsPort)).replace(/^# /, '').trim().split('\n').map((line) => line.split(','));
        const [name, status, backup] = [header.indexOf('svname'), header.indexOf('status'), header.indexOf('bck')];
        return Object.fromEntries(rows.filter((row) => row[0] === 'replicas' && !['BACKEND', 'FRONTEND'].includes(row[name]) && row[backup] !== '1').map((row) => [row[name], row[status]]));
      },
    };
  });
}

export interface NginxService extends Service {
  /** The balancer's origin. */
  origin: string;
}

/**
 * nginx with deploy/nginx.conf, changed only as its comments tell a user to (its server lines name
 * `replicas`, host:port each; it listens on loopback) and wrapped in `events {} http { ... }` as they
 * say, with its pid, logs and temporary files in `dir`, on a port found free (see onFreePorts: nginx
 * cannot bind port 0 and say which it got). One process (master_process off): a stop ends all of it.
 */
export function startNginx(binary: string, dir: string, replicas: [string, string]): Promise<NginxService> {
  const shipped = readFileSync(path.join(REPO, 'deploy', 'nginx.conf'), 'utf8');
  const servers = [...shipped.matchAll(/^(\s*server )(\S+)( .*;)$/gm)];
  if (servers.length !== 2 || !/^\s*listen 8080;$/m.test(shipped)) throw new Error('deploy/nginx.conf no longer has two server lines and `listen 8080;` for the tests to point at the replicas');
  return onFreePorts(1, async ([port]) => {
    let upstream = shipped.replace(/^(\s*)listen 8080;$/m, `$1listen 127.0.0.1:${port};`);
    servers.forEach(([line, indent, , rest], i) => (upstream = upstream.replace(line, `${indent}${replicas[i]}${rest}`)));
    const temp = ['client_body', 'proxy', 'fastcgi', 'uwsgi', 'scgi'].map((kind) => `${kind}_temp_path ${path.join(dir, `${kind}-temp`)};`);
    const config = path.join(dir, 'nginx.conf');
    await writeFile(
      config,
      [`daemon off;`, `master_process off;`, `pid ${path.join(dir, 'nginx.pid')};`, 'error_log stderr info;', 'events {}', 'http {', 'access_log off;', ...temp, upstream, '}', ''].join('\n'),
    );
    const service = startProcess(binary, ['-p', dir, '-c', config]);
    const origin = `http://127.0.0.1:${port}`;
    // A replica's own answer through it, not merely something accepting connections on the port.
    await until(service, 'nginx', () => fetch(`${origin}/health`, { signal: AbortSignal.timeout(5000) }).then((res) => (res.ok && res.headers.get('server')?.startsWith('nginx') ? true : undefined), () => undefined));
    return { ...service, origin };
  });
}
