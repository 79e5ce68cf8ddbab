import { execFile, spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, readFileSync } from 'node:fs';
import { chmod, chown, mkdir, mkdtemp, readdir, stat } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { exitStatusOf, UsageError } from '../src/cli/exit-status.js';
import { loadConfig, settingsHelp } from '../src/config.js';
import { WORKER_STOP_GRACE_MS } from '../src/engine/pool.js';
import { LARGEST_FORM_BYTES } from '../src/http/edits.js';
import { ANSWER_GRACE_MS } from '../src/http/shutdown.js';
import { MAX_UPLOAD_BYTES } from '../src/http/uploads.js';
import { CHECK_TIMEOUT_MS } from '../src/store/s3-store.js';
import { startTestServer, type TestServer } from './helpers/api-server.js';
import { imagegenArgs, PROJECT_ROOT } from './helpers/cli.js';
import { FakeEngine } from './helpers/engines.js';
import { readImageFile } from './helpers/picture.js';
import { listeningUrl } from './helpers/server-process.js';

/**
 * The files of deploy/ users copy as they are, read against the server they run (what can be checked
 * without Docker or Kubernetes): every variable they set is a setting with a valid value, or one the AWS
 * SDK reads; the ports agree; the probes' paths are the server's; the stop grace periods outlast the
 * server's drain. test/replicas.test.ts and test/nginx.test.ts run the balancers' files for real, and
 * this file runs the systemd unit's server as the unit starts it (its user, environment and limits).
 */

const DEPLOY = path.resolve(import.meta.dirname, '..', 'deploy');
const read = (name: string) => readFileSync(path.join(DEPLOY, name), 'utf8');

const dockerfile = read('Dockerfile');
const compose = read('docker-compose.yml');
const deployment = read('k8s/deployment.yaml');
const unit = read('imagegen.service');

/**
 * Variables the server's own libraries read, not settings of ours: the AWS SDK's credentials and region;
 * Node's mode; the dynamic loader's path (CUDA's libraries); the GPU drivers' caches (Mesa's and NVIDIA's
 * Vulkan pipelines under XDG_CACHE_HOME, CUDA's kernels built from PTX).
 */
const LIBRARY_VARIABLES = new Set(['AWS_ACCESS_KEY_ID', 'AWS_SECRET_ACCESS_KEY', 'AWS_REGION', 'NODE_ENV', 'LD_LIBRARY_PATH', 'XDG_CACHE_HOME', 'CUDA_CACHE_PATH']);
const SETTINGS = new Set(settingsHelp.map((setting) => setting.env));

/** The `KEY: value` lines indented under the line `header` (the first one matching), quotes taken off: a YAML map of scalars. */
function yamlMap(text: string, header: RegExp): Record<string, string> {
  const lines = text.split('\n');
  const start = lines.findIndex((line) => header.test(line));
  expect(start, `a line matching ${header}`).toBeGreaterThanOrEqual(0);
  const indent = /^ */.exec(lines[start])![0].length;
  const map: Record<string, string> = {};
  for (const line of lines.slice(start + 1)) {
    if (line.trim() === '' || line.trim().startsWith('#')) continue;
    if (/^ */.exec(line)![0].length <= indent) break;
    const [, key, value] = /^\s*([A-Za-z0-9_]+):\s*(.*?)\s*(?:#.*)?$/.exec(line) ?? [];
    if (key) map[key] = value.replace(/^"(.*)"$/, '$1');
  }
  return map;
}

/** The Dockerfile's runtime stage's ENV, as `ENV A=1 B=2` sets it. */
function dockerEnv(): Record<string, string> {
  const runtime = dockerfile.slice(dockerfile.lastIndexOf('\nFROM '));
  const line = /^ENV (.*)$/m.exec(runtime)![1];
  return Object.fromEntries(line.split(/\s+/).map((pair) => pair.split('=') as [string, string]));
}

/** What one number in `text` is, by the pattern that holds it. */
function number(text: string, pattern: RegExp): number {
  const match = pattern.exec(text);
  expect(match, `${pattern}`).not.toBeNull();
  return Number(match![1]);
}

/** A systemd unit's `Key=value` lines, in order (a key may come more than once: Environment=), comments and section headers left out. */
function unitEntries(text: string): [key: string, value: string][] {
  return text
    .split('\n')
    .map((line) => line.trim())
    .filter((line) => line !== '' && !line.startsWith('#') && !line.startsWith('['))
    .map((line) => [line.slice(0, line.indexOf('=')), line.slice(line.indexOf('=') + 1)]);
}

/** The value of a key the unit sets once. */
function unitValue(key: string): string {
  const values = unitEntries(unit).filter(([name]) => name === key);
  expect(values.map(([name]) => name), `${key}= once in deploy/imagegen.service`).toEqual([key]);
  return values[0][1];
}

/** `NAME=value` pairs as an environment. */
const assignments = (pairs: string[]): Record<string, string> => Object.fromEntries(pairs.map((pair) => [pair.slice(0, pair.indexOf('=')), pair.slice(pair.indexOf('=') + 1)]));

/** The unit's Environment= lines. */
const unitEnv = assignments(unitEntries(unit).flatMap(([key, value]) => (key === 'Environment' ? [value] : [])));
/** deploy/imagegen.env.example's settings, every commented `#NAME=value` line taken as set. */
const envFileExample = assignments([...read('imagegen.env.example').matchAll(/^#([A-Z][A-Z0-9_]*=\S*)$/gm)].map(([, pair]) => pair));

const containers = {
  // The image listens beyond loopback: it serves only once given keys at run (docker run -e API_KEYS=...).
  Dockerfile: { ...dockerEnv(), API_KEYS: 'sk-given-at-run-0123456789' },
  'docker-compose.yml': { ...dockerEnv(), ...yamlMap(compose, /^ {2}environment:$/) },
  // The pods run an image of the user's own, built for CUDA (docs/deploy.md): the ConfigMap alone sets what deploy/Dockerfile's ENV would.
  'k8s/deployment.yaml': { ...yamlMap(deployment, /^data:$/), AWS_ACCESS_KEY_ID: 'from the Secret', AWS_SECRET_ACCESS_KEY: 'from the Secret' },
  'imagegen.service': unitEnv,
  // What the admin's EnvironmentFile= adds, all of it at once: HOST beyond loopback comes with its keys file.
  'imagegen.service with imagegen.env.example': { ...unitEnv, ...envFileExample },
};

/** The server's drain on SIGTERM in seconds, beyond SHUTDOWN_TIMEOUT_SECONDS: cancelled answers, then the workers stopping. */
const CLOSING_SECONDS = (ANSWER_GRACE_MS + WORKER_STOP_GRACE_MS) / 1000;

describe('deploy/ against the server', () => {
  it.each(Object.entries(containers))('%s sets only settings and variables its libraries read, each valid', (_file, env) => {
    expect(Object.keys(env).length).toBeGreaterThan(3);
    expect(Object.keys(env).filter((name) => !SETTINGS.has(name) && !LIBRARY_VARIABLES.has(name))).toEqual([]);
    // Every setting read from this environment alone, as the container's server reads it: none refused.
    expect(() => loadConfig({}, env)).not.toThrow();
  });

  it('listens where the image, the Service, the balancer and the scrapers look', () => {
    const port = String(loadConfig({}, containers['k8s/deployment.yaml']).port);
    expect(number(dockerfile, /^EXPOSE (\d+)$/m)).toBe(Number(port));
    expect(number(deployment, /containerPort: (\d+)/)).toBe(Number(port));
    expect(/prometheus\.io\/port: "(\d+)"/.exec(deployment)?.[1]).toBe(port);
    expect(String(loadConfig({}, containers['docker-compose.yml']).port)).toBe(port);
    expect([...compose.matchAll(/REPLICA\d: imagegen-\d:(\d+)/g)].map(([, on]) => on)).toEqual([port, port]);
    // Image URLs name the balancer's published port.
    const published = /ports: \["(?:127\.0\.0\.1:)?(\d+):8080"\]/.exec(compose)?.[1];
    expect(loadConfig({}, containers['docker-compose.yml']).publicBaseUrl).toBe(`http://localhost:${published}`);
  });

  it("publishes the compose file's ports on the host's loopback only: its API keys are the repository's examples", () => {
    // Docker publishes a bare "8080:8080" on every interface of the host (past ufw's rules too), where
    // anyone on the network could use the server with a key anyone can read in deploy/api-keys.example.
    const keys = yamlMap(compose, /^ {2}environment:$/).API_KEYS_FILE;
    expect(compose).toContain(`./api-keys.example:${keys}:ro`);
    const lists = [...compose.matchAll(/ports: \[([^\]]*)\]/g)].map(([, list]) => list);
    // Every service's ports in that one form: a block list ("ports:" then "- ...") would escape the check.
    expect(compose.match(/^\s*ports:/gm)?.length).toBe(lists.length);
    const ports = lists.flatMap((list) => list.split(',').map((port) => port.trim().replace(/^"(.*)"$/, '$1')));
    expect(ports.length).toBeGreaterThan(0);
    expect(ports.filter((port) => !port.startsWith('127.0.0.1:'))).toEqual([]);
  });

  it("mounts the folders the settings name, DATA_DIR writable by the image's user", () => {
    const config = loadConfig({}, containers['k8s/deployment.yaml']);
    const mounts = Object.fromEntries([...deployment.matchAll(/\{ name: ([\w-]+), mountPath: (\S+?)(?:, readOnly: true)? \}/g)].map(([, name, at]) => [name, at]));
    expect(mounts).toEqual({ 'api-keys': path.dirname(config.apiKeysFile!), models: config.modelsDir, data: config.dataDir });
    expect(deployment).toMatch(/secret: \{ secretName: imagegen, items: \[\{ key: api-keys, path: api-keys \}\] \}/);
    expect(path.basename(config.apiKeysFile!)).toBe('api-keys');
    // The image's own DATA_DIR is made and given to the user the server runs as.
    expect(dockerfile).toMatch(new RegExp(`^RUN mkdir -p ${dockerEnv().DATA_DIR} && chown node:node ${dockerEnv().DATA_DIR}$`, 'm'));
    expect(dockerfile).toMatch(/^USER node$/m);
    // A volume (after the folder is the user's: a volume starts with what the image has there), so that
    // the images promised for a day do not go with the container.
    const volume = dockerfile.search(new RegExp(`^VOLUME ${dockerEnv().DATA_DIR}$`, 'm'));
    expect(volume).toBeGreaterThan(dockerfile.search(/^RUN mkdir -p/m));
  });

  it('gives a stopping replica the time the server drains', () => {
    const k8s = loadConfig({}, containers['k8s/deployment.yaml']);
    const pause = number(deployment, /command: \["sleep", "(\d+)"\]/);
    expect(number(deployment, /terminationGracePeriodSeconds: (\d+)/)).toBeGreaterThan(pause + k8s.shutdownTimeoutSeconds + CLOSING_SECONDS);
    const docker = loadConfig({}, containers['docker-compose.yml']);
    expect(number(compose, /stop_grace_period: (\d+)s/)).toBeGreaterThan(docker.shutdownTimeoutSeconds + CLOSING_SECONDS);
    expect(number(dockerfile, /docker stop -t (\d+)/)).toBeGreaterThan(docker.shutdownTimeoutSeconds + CLOSING_SECONDS);
    for (const env of [containers['imagegen.service'], containers['imagegen.service with imagegen.env.example']]) {
      expect(number(unit, /^TimeoutStopSec=(\d+)$/m)).toBeGreaterThan(loadConfig({}, env).shutdownTimeoutSeconds + CLOSING_SECONDS);
    }
  });

  it("lets through nginx every body a replica takes, and says what nginx's own 413 holds to", () => {
    const nginx = read('nginx.conf');
    const readme = readFileSync(path.join(DEPLOY, '..', 'README.md'), 'utf8');
    // deploy/nginx.conf and README's snippet: above an edit's largest form (two files of OpenAI's 50 MB)
    // and the default BODY_LIMIT, so that what the replicas refuse they answer themselves.
    const sizes = [...`${nginx}\n${readme}`.matchAll(/client_max_body_size (\d+)m;/g)].map(([, mebibytes]) => Number(mebibytes) * 1024 ** 2);
    expect(sizes).toHaveLength(2);
    for (const size of sizes) expect(size).toBeGreaterThanOrEqual(Math.max(LARGEST_FORM_BYTES, loadConfig({}, {}).bodyLimit));
    expect(nginx).toContain(`a multipart/form-data upload of at most ${MAX_UPLOAD_BYTES / 1024 ** 2} MiB a file`);
  });

  it("leaves out of the image's build context what git leaves out of the clone: models pulled into it (README's ./models-installed) would be sent to the builder and copied into its stage", () => {
    const patterns = (text: string) =>
      text
        .split('\n')
        .map((line) => line.trim())
        .filter((line) => line !== '' && !line.startsWith('#'))
        .map((line) => line.replace(/^\/|\/$/g, ''));
    const leftOut = new Set(patterns(read('Dockerfile.dockerignore')));
    expect(patterns(readFileSync(path.join(DEPLOY, '..', '.gitignore'), 'utf8')).filter((pattern) => !leftOut.has(pattern))).toEqual([]);
  });

  it("waits for /ready's answer, which waits up to CHECK_TIMEOUT_MS for the bucket, rather than its own timeout", () => {
    expect(number(deployment, /readinessProbe:[^]*?timeoutSeconds: (\d+)/) * 1000).toBeGreaterThan(CHECK_TIMEOUT_MS);
    expect(number(read('haproxy.cfg'), /^\s*timeout check (\d+)s$/m) * 1000).toBeGreaterThan(CHECK_TIMEOUT_MS);
  });

  describe('probes', () => {
    let server: TestServer<FakeEngine>;
    beforeAll(async () => void (server = await startTestServer({ engine: new FakeEngine() })));
    afterAll(() => server.close());

    it("probe the server's own paths, without a key", async () => {
      const paths = [...deployment.matchAll(/httpGet: \{ path: (\S+), port: http \}/g)].map(([, at]) => at);
      paths.push(/option httpchk GET (\S+)/.exec(read('haproxy.cfg'))![1]);
      expect(new Set(paths)).toEqual(new Set(['/health', '/ready']));
      for (const at of paths) {
        const res = await fetch(`${server.origin}${at}`);
        expect([at, res.status]).toEqual([at, 200]);
      }
    });
  });

  describe('deploy/imagegen.service', () => {
    it("runs the README's command in the checkout its head says to make, with DATA_DIR and MODELS_DIR in its state, where its `models pull` installs", () => {
      const readme = readFileSync(path.join(PROJECT_ROOT, 'README.md'), 'utf8');
      const command = /run the built\s+server as `([^`]+)`/.exec(readme)?.[1];
      expect(unitValue('ExecStart')).toBe(command);
      expect(JSON.parse(readFileSync(path.join(PROJECT_ROOT, 'package.json'), 'utf8')).scripts.start).toBe(command);
      const checkout = unitValue('WorkingDirectory');
      expect(unit).toContain(`git clone <this repository> ${checkout} && cd ${checkout} && npm ci && npm run build`);
      const config = loadConfig({}, unitEnv);
      const state = unitValue('StateDirectory').split(' ').map((dir) => `/var/lib/${dir}`);
      expect(state).toEqual(expect.arrayContaining([config.dataDir, config.modelsDir]));
      expect(unit).toContain(`cd ${checkout} && sudo -u ${unitValue('User')} node dist/cli/main.js models pull`);
      expect(/models pull .* --models-dir (\S+)$/m.exec(unit)?.[1]).toBe(config.modelsDir);
      const cache = `/var/cache/${unitValue('CacheDirectory')}`;
      expect([unitEnv.XDG_CACHE_HOME, path.dirname(unitEnv.CUDA_CACHE_PATH)]).toEqual([cache, cache]);
      expect(unitValue('User')).not.toBe('root');
      // Secure by default: loopback, and no key in a file every user may read (systemctl show).
      expect(config.host).toBe('127.0.0.1');
      expect(Object.keys(unitEnv)).not.toContain('API_KEYS');
    });

    it('restarts a server that failed, not one whose settings were refused: it exits with RestartPreventExitStatus', async () => {
      expect(unitValue('Restart')).toBe('on-failure');
      expect(unitValue('RestartPreventExitStatus')).toBe(String(exitStatusOf(new UsageError('a setting refused'))));
      // HOST beyond loopback without keys, as the unit runs it: refused at start.
      const refused = promisify(execFile)(process.execPath, imagegenArgs('serve'), { cwd: PROJECT_ROOT, env: { PATH: process.env.PATH, ...unitEnv, HOST: '0.0.0.0' }, timeout: 30_000 });
      await expect(refused).rejects.toMatchObject({ code: Number(unitValue('RestartPreventExitStatus')), stderr: expect.stringContaining('refusing to serve without authentication') });
    });

    it('lets the server open a file or a connection to the bucket for each of MAX_CONNECTIONS sockets, and more', () => {
      expect(Number(unitValue('LimitNOFILE'))).toBeGreaterThanOrEqual(2 * loadConfig({}, unitEnv).maxConnections + 1024);
    });

    it("leaves the server what it needs: the GPU's device nodes, V8's JIT, /proc/meminfo, its workers killed for memory replaced by the server", () => {
      const settings = new Set(unitEntries(unit).map(([key]) => key));
      const taking = {
        PrivateDevices: 'hides /dev/nvidia* and /dev/dri',
        DevicePolicy: 'allows devices by a list',
        DeviceAllow: 'allows devices by a list',
        ProtectClock: 'implies DeviceAllow=char-rtc, a list of the devices allowed, on systemd versions such as 252 (Debian 12)',
        MemoryDenyWriteExecute: "refuses V8's JIT the memory it writes code in",
        ProcSubset: 'hides /proc/meminfo, which the memory plan reads',
      };
      expect(Object.keys(taking).filter((key) => settings.has(key))).toEqual([]);
      // systemd's default, stop, stops the whole service when the kernel kills a worker (engine/worker.ts asks it to pick them first).
      expect(unitValue('OOMPolicy')).toBe('continue');
    });

    // systemd-analyze looks a bare command up in a fixed path, not the caller's PATH.
    const analyze = '/usr/bin/systemd-analyze';
    const nodeFound = ['/usr/local/sbin', '/usr/local/bin', '/usr/sbin', '/usr/bin'].some((dir) => existsSync(path.join(dir, 'node')));
    const noVerify = !existsSync(analyze) ? 'needs systemd-analyze (Debian: systemd)' : !nodeFound ? 'node is in none of /usr/local/bin, /usr/bin, where systemd looks a bare `node` up: the unit would not start here either' : undefined;
    it.skipIf(noVerify !== undefined)(`passes systemd-analyze verify with nothing to say${noVerify ? ` (skipped: ${noVerify})` : ''}`, async () => {
      // Unknown keys and values it cannot parse are warnings, which leave its exit status 0: the output must be empty too.
      const { stdout, stderr } = await promisify(execFile)(analyze, ['verify', path.join(DEPLOY, 'imagegen.service')], { timeout: 60_000 });
      expect(stdout + stderr).toBe('');
    });

    const runAs = unitUserProbe();
    it.skipIf('why' in runAs)(
      `starts as the unit starts it (its own user, no privileges, its environment, umask and file limit): serves, writes only its state, reloads on ExecReload, and exits 0 on SIGTERM to its group${'why' in runAs ? ` (skipped: ${runAs.why})` : ''}`,
      async () => {
        // The run's temporary folder, 0700, root's: the server's user needs to pass through it to its state (only that: not to list it).
        await chmod(os.tmpdir(), (await stat(os.tmpdir())).mode | 0o001);
        const root = await mkdtemp(path.join(os.tmpdir(), 'imagegen-unit-'));
        await chmod(root, 0o711);
        // systemd's directories, as it makes them: the user's, with their mode; here under the test's root.
        const onHost = (dir: string) => dir.replace(/^\/var\/(lib|cache)\//, `${root}/$1/`);
        const made = [
          ...unitValue('StateDirectory').split(' ').map((dir) => ({ dir: onHost(`/var/lib/${dir}`), mode: parseInt(unitValue('StateDirectoryMode'), 8) })),
          { dir: onHost(`/var/cache/${unitValue('CacheDirectory')}`), mode: 0o755 },
          { dir: path.join(root, 'home'), mode: 0o755 },
        ];
        for (const { dir, mode } of made) {
          await mkdir(dir, { recursive: true });
          await chown(dir, UNIT_USER, UNIT_USER);
          await chmod(dir, mode);
        }
        for (const dir of [path.join(root, 'lib'), path.join(root, 'cache')]) await chmod(dir, 0o711);
        const env = {
          // What systemd gives a service: its fixed PATH, the user's home (made empty here: the server writes nothing there), then the unit's.
          PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin',
          HOME: path.join(root, 'home'),
          ...Object.fromEntries(Object.entries(unitEnv).map(([name, value]) => [name, onHost(value)])),
          // Not the unit's 8000: a port free on this machine.
          PORT: '0',
        };
        const limit = unitValue('LimitNOFILE');
        const child = spawn(
          'prlimit',
          [`--nofile=${limit}:${limit}`, '--', 'setpriv', ...USER_ARGS, '--', 'sh', '-c', `umask ${unitValue('UMask')} && exec "$@"`, 'sh', ...unitValue('ExecStart').split(' ')],
          { cwd: PROJECT_ROOT, env, stdio: ['ignore', 'pipe', 'pipe'], detached: true },
        );
        const exited = once(child, 'exit').then(([code]) => code as number | null);
        const log: string[] = [];
        let stderr = '';
        child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
        try {
          const baseURL = await listeningUrl(child.stdout, exited, () => new Error(`the unit's server exited before listening:\n${stderr}`), (line) => log.push(line));
          const client = new OpenAI({ baseURL, apiKey: 'unused-without-API_KEYS', maxRetries: 0 });
          const { data } = await client.images.generate({ model: 'dall-e-3', prompt: 'a red circle', size: '256x256', response_format: 'url' });
          const image = Buffer.from(await (await fetch(data![0].url!)).arrayBuffer());
          expect((await readImageFile(image)).reading).toMatchObject({ colour: 'red', shape: 'circle' });
          // Its image is in DATA_DIR, the user's, as the unit's UMask made it.
          const images = path.join(onHost(unitEnv.DATA_DIR), 'images');
          const [file] = await readdir(images);
          const stored = await stat(path.join(images, file));
          expect([stored.uid, stored.mode & 0o777]).toEqual([UNIT_USER, 0o666 & ~parseInt(unitValue('UMask'), 8)]);
          expect(await readdir(env.HOME)).toEqual([]);

          // ExecReload, $MAINPID being the server (prlimit, setpriv and sh each became the next).
          const reload = unitValue('ExecReload').replace('$MAINPID', String(child.pid)).split(' ');
          await promisify(execFile)(reload[0], reload.slice(1));
          await expect.poll(() => log.some((line) => line.includes('SIGHUP: there are no API keys to reload'))).toBe(true);
          expect((await fetch(`${baseURL.replace(/\/v1$/, '')}/health`)).status).toBe(200);

          // systemctl stop: SIGTERM to the whole control group (KillMode's default), workers included.
          const stopped = Date.now();
          process.kill(-child.pid!, 'SIGTERM');
          expect(await exited).toBe(0);
          expect(Date.now() - stopped).toBeLessThan(Number(unitValue('TimeoutStopSec')) * 1000);
        } finally {
          if (child.exitCode === null) process.kill(-child.pid!, 'SIGKILL');
        }
      },
    );
  });
});

/** The user the unit's server runs as here: nobody (65534 on Debian), which owns nothing of the checkout. */
const UNIT_USER = 65534;
/** setpriv's arguments to run as the unit runs its server: User=, Group=, no other groups, NoNewPrivileges=, an empty CapabilityBoundingSet=. */
const USER_ARGS = [`--reuid=${UNIT_USER}`, `--regid=${UNIT_USER}`, '--clear-groups', '--no-new-privs', '--inh-caps=-all', '--bounding-set=-all'];

/** Whether this machine can start a server as the unit does, or why not. */
function unitUserProbe(): { why: string } | Record<string, never> {
  if (process.platform !== 'linux' || process.getuid?.() !== 0) return { why: 'needs root on Linux, to start the server as another user, as systemd does' };
  const found = spawnSync('setpriv', [...USER_ARGS, '--', 'prlimit', '--version']);
  if (found.error || found.status !== 0) return { why: 'needs setpriv and prlimit (Debian: util-linux)' };
  const reads = spawnSync('setpriv', [...USER_ARGS, '--', 'test', '-r', path.join(PROJECT_ROOT, 'dist', 'cli', 'main.js')]);
  if (reads.status !== 0) return { why: `user ${UNIT_USER} cannot read the checkout (${PROJECT_ROOT}), as the unit's user must` };
  return {};
}
