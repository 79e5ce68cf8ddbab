import { readFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig, settingsHelp } from '../src/config.js';
import { WORKER_STOP_GRACE_MS } from '../src/engine/pool.js';
import { LARGEST_FORM_BYTES } from '../src/http/edits.js';
import { ANSWER_GRACE_MS } from '../src/http/shutdown.js';
import { MAX_UPLOAD_BYTES } from '../src/http/uploads.js';
import { CHECK_TIMEOUT_MS } from '../src/store/s3-store.js';
import { startTestServer, type TestServer } from './helpers/api-server.js';
import { FakeEngine } from './helpers/engines.js';

/**
 * The files of deploy/ users copy as they are, read against the server they run (what can be checked
 * without Docker or Kubernetes): every variable they set is a setting with a valid value, or one the AWS
 * SDK reads; the ports agree; the probes' paths are the server's; the stop grace periods outlast the
 * server's drain. test/replicas.test.ts and test/nginx.test.ts run the balancers' files for real.
 */

const DEPLOY = path.resolve(import.meta.dirname, '..', 'deploy');
const read = (name: string) => readFileSync(path.join(DEPLOY, name), 'utf8');

const dockerfile = read('Dockerfile');
const compose = read('docker-compose.yml');
const deployment = read('k8s/deployment.yaml');

/** Variables the server's own libraries read (the AWS SDK's credentials and region; Node's mode), not settings of ours. */
const LIBRARY_VARIABLES = new Set(['AWS_ACCESS_KEY_ID', 'AWS_SECRET_ACCESS_KEY', 'AWS_REGION', 'NODE_ENV']);
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

const containers = {
  // The image listens beyond loopback: it serves only once given keys at run (docker run -e API_KEYS=...).
  Dockerfile: { ...dockerEnv(), API_KEYS: 'sk-given-at-run-0123456789' },
  'docker-compose.yml': { ...dockerEnv(), ...yamlMap(compose, /^ {2}environment:$/) },
  // The pods run an image of the user's own, built for CUDA (docs/deploy.md): the ConfigMap alone sets what deploy/Dockerfile's ENV would.
  'k8s/deployment.yaml': { ...yamlMap(deployment, /^data:$/), AWS_ACCESS_KEY_ID: 'from the Secret', AWS_SECRET_ACCESS_KEY: 'from the Secret' },
};

/** The server's drain on SIGTERM in seconds, beyond SHUTDOWN_TIMEOUT_SECONDS: cancelled answers, then the workers stopping. */
const CLOSING_SECONDS = (ANSWER_GRACE_MS + WORKER_STOP_GRACE_MS) / 1000;

describe('deploy/ against the server', () => {
  it.each(Object.entries(containers))('%s sets only settings and SDK variables, each valid', (_file, env) => {
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
    const published = /ports: \["(\d+):8080"\]/.exec(compose)?.[1];
    expect(loadConfig({}, containers['docker-compose.yml']).publicBaseUrl).toBe(`http://localhost:${published}`);
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
  });

  it('gives a stopping replica the time the server drains', () => {
    const k8s = loadConfig({}, containers['k8s/deployment.yaml']);
    const pause = number(deployment, /command: \["sleep", "(\d+)"\]/);
    expect(number(deployment, /terminationGracePeriodSeconds: (\d+)/)).toBeGreaterThan(pause + k8s.shutdownTimeoutSeconds + CLOSING_SECONDS);
    const docker = loadConfig({}, containers['docker-compose.yml']);
    expect(number(compose, /stop_grace_period: (\d+)s/)).toBeGreaterThan(docker.shutdownTimeoutSeconds + CLOSING_SECONDS);
    expect(number(dockerfile, /docker stop -t (\d+)/)).toBeGreaterThan(docker.shutdownTimeoutSeconds + CLOSING_SECONDS);
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
});
