import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { OPENAI_MODEL_NAMES } from '../src/api/dialects.js';
import { loadConfig, loadModelSettings, settingsHelp } from '../src/config.js';
import { LARGEST_FORM_BYTES } from '../src/http/edits.js';
import { ConfigError } from '../src/util/config-error.js';

/** Configuration from flags and environment, secure by default. */

const problems = (fn: () => unknown): string[] => {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    return (err as ConfigError).problems;
  }
  throw new Error('expected a ConfigError');
};

describe('loadConfig', () => {
  it('has safe defaults: loopback, port 8000, 24 h URLs, OpenAI names aliased to the demo model', () => {
    const config = loadConfig({}, {});
    expect(config).toMatchObject({
      host: '127.0.0.1',
      port: 8000,
      apiKeys: [],
      dataDir: './data',
      defaultModel: 'demo-shapes',
      imageTtlSeconds: 86400,
      // Unset: the server picks one per device (src/engine/worker-count.ts).
      workers: undefined,
      queueMax: 64,
      bodyLimit: 1024 * 1024,
      trustProxy: false,
      modelAliases: { 'dall-e-2': 'demo-shapes', 'dall-e-3': 'demo-shapes', 'gpt-image-1': 'demo-shapes' },
    });
  });

  it('reads environment variables, flags winning over them', () => {
    const env = { PORT: '9000', API_KEYS: 'sk-a, sk-b,', MAX_STORE_BYTES: '512m', WORKERS: '2' };
    const config = loadConfig({ port: '9001' }, env);
    expect(config).toMatchObject({ port: 9001, apiKeys: ['sk-a', 'sk-b'], maxStoreBytes: 512 * 1024 ** 2, workers: 2 });
  });

  it('refuses a non-loopback host without API keys, and explains', () => {
    const [problem] = problems(() => loadConfig({}, { HOST: '0.0.0.0' }));
    expect(problem).toMatch(/HOST is 0\.0\.0\.0 but no API_KEYS/);
    const config = loadConfig({}, { HOST: '0.0.0.0', API_KEYS: 'sk-x' });
    expect(config.trustProxy).toBe(false);
  });

  it("refuses a hop count in TRUST_PROXY: Express's 1 (the last proxy), read as true, trusted every address a client writes", () => {
    for (const hops of ['1', '2']) {
      expect(problems(() => loadConfig({}, { TRUST_PROXY: hops }))).toEqual([
        `TRUST_PROXY (--trust-proxy): expected the proxies' addresses or CIDR ranges (e.g. 127.0.0.1,10.0.0.0/8), or true to trust every peer: a hop count is not taken (got '${hops}')`,
      ]);
    }
    expect(loadConfig({}, { TRUST_PROXY: '0' }).trustProxy).toBe(false);
    expect(loadConfig({}, { TRUST_PROXY: 'yes' }).trustProxy).toBe(true);
    expect(loadConfig({}, { TRUST_PROXY: '127.0.0.1, loopback' }).trustProxy).toEqual(['127.0.0.1', 'loopback']);
  });

  it('names each invalid setting with its variable and flag', () => {
    const found = problems(() => loadConfig({}, { PORT: 'eighty', WORKERS: '0', LOG_LEVEL: 'loud', PUBLIC_BASE_URL: 'example.com' }));
    expect(found).toHaveLength(4);
    expect(found[0]).toMatch(/^PORT \(--port\): expected a whole number \(got 'eighty'\)/);
    expect(found.join('\n')).toMatch(/WORKERS \(--workers\)/);
    expect(found.join('\n')).toMatch(/PUBLIC_BASE_URL \(--public-base-url\)/);
  });

  it("says a whole number's range in the settings table's words, not zod's", () => {
    expect(problems(() => loadConfig({}, { WORKERS: '65' }))).toEqual(["WORKERS (--workers): expected 1 to 64 (got '65')"]);
    expect(problems(() => loadConfig({}, { STREAM_KEEP_ALIVE_SECONDS: '0' }))).toEqual(["STREAM_KEEP_ALIVE_SECONDS (--stream-keep-alive-seconds): expected at least 1 (got '0')"]);
  });

  it('takes CUDA_DEVICES as the other lists, spaces after commas included, and refuses what is not a device id', () => {
    expect(loadConfig({}, { CUDA_DEVICES: '0, 1' }).cudaDevices).toEqual([0, 1]);
    expect(loadConfig({}, {}).cudaDevices).toEqual([0]);
    expect(problems(() => loadConfig({}, { CUDA_DEVICES: '0,gpu1' }))[0]).toMatch(/^CUDA_DEVICES \(--cuda-devices\): expected device ids separated by commas, e\.g\. 0,1/);
    expect(problems(() => loadConfig({}, { CUDA_DEVICES: ',' }))[0]).toMatch(/^CUDA_DEVICES \(--cuda-devices\): expected device ids/);
  });

  it('takes GRAPH_REWRITES as all (the default) or exact, for the server and for the commands that run models', () => {
    expect([loadConfig({}, {}).graphRewrites, loadConfig({}, { GRAPH_REWRITES: 'exact' }).graphRewrites, loadModelSettings({}, { GRAPH_REWRITES: 'exact' }).graphRewrites]).toEqual(['all', 'exact', 'exact']);
    expect(problems(() => loadConfig({}, { GRAPH_REWRITES: 'none' }))[0]).toMatch(/^GRAPH_REWRITES \(--graph-rewrites\): .*all.*exact/);
  });

  it('takes VAE_TILING as auto, always or a tile side in pixels that tiles can have', () => {
    expect(['auto', 'always', '256', '1024'].map((value) => loadConfig({}, { VAE_TILING: value }).vaeTiling)).toEqual(['auto', 'always', 256, 1024]);
    for (const value of ['100', '300', '8192', 'never']) {
      expect(problems(() => loadConfig({}, { VAE_TILING: value }))).toEqual([
        `VAE_TILING (--vae-tiling): expected auto, always, or the side of the tiles in pixels: a multiple of 64 from 256 to 4096 (got '${value}')`,
      ]);
    }
  });

  it('refuses a BODY_LIMIT over UPLOAD_MEMORY, which holds JSON bodies as they arrive: a larger one would get 429 for good', () => {
    expect(problems(() => loadConfig({}, { BODY_LIMIT: '300m' }))).toEqual([
      'BODY_LIMIT must not exceed UPLOAD_MEMORY: a JSON body is held in UPLOAD_MEMORY as it arrives, so a larger one could never be read; raise UPLOAD_MEMORY too',
    ]);
    expect(loadConfig({}, { BODY_LIMIT: '300m', UPLOAD_MEMORY: '300m' }).bodyLimit).toBe(300 * 1024 ** 2);
  });

  it('holds UPLOAD_MEMORY to at least the largest form an edit takes, so that one always gets in', () => {
    expect(LARGEST_FORM_BYTES).toBe(109 * 1024 ** 2);
    expect(problems(() => loadConfig({}, { UPLOAD_MEMORY: String(LARGEST_FORM_BYTES - 1) }))).toEqual([expect.stringMatching(/^UPLOAD_MEMORY .*expected at least 128m/)]);
    // The default's half, one key's share, holds one, and the other half another key's.
    expect(loadConfig({}, {}).uploadMemory / 2).toBeGreaterThanOrEqual(LARGEST_FORM_BYTES);
  });

  it("takes PRELOAD=none as loading nothing, and refuses 'none' among models (it read as a model of that name)", () => {
    expect(loadConfig({}, { PRELOAD: 'None' }).preload).toEqual([]);
    expect(loadConfig({}, { PRELOAD: 'sd15, sdxl' }).preload).toEqual(['sd15', 'sdxl']);
    expect(problems(() => loadConfig({}, { PRELOAD: 'none,sd15' }))).toEqual(["PRELOAD lists 'none' (load nothing) among models: set PRELOAD=none alone, or list only the models to load"]);
  });

  it('bounds IMAGE_TTL_SECONDS where an expiry is still a date (an S3 upload sent it as an invalid one beyond)', () => {
    expect(loadConfig({}, { IMAGE_TTL_SECONDS: '3155760000' }).imageTtlSeconds).toBe(3_155_760_000);
    expect(problems(() => loadConfig({}, { IMAGE_TTL_SECONDS: '99999999999999' }))[0]).toMatch(/^IMAGE_TTL_SECONDS .*expected 1 to 3155760000/);
  });

  it('needs TLS_CERT and TLS_KEY together', () => {
    expect(problems(() => loadConfig({ tlsCert: 'cert.pem' }, {}))).toEqual(['TLS_CERT and TLS_KEY must be set together']);
  });

  it('merges MODEL_ALIASES over the defaults; an empty target removes one', () => {
    const config = loadConfig({}, { DEFAULT_MODEL: 'sdxl', MODEL_ALIASES: 'dall-e-3=flux, dall-e-2=, my-model=sd15' });
    const defaults = Object.fromEntries(OPENAI_MODEL_NAMES.filter((name) => name !== 'dall-e-2').map((name) => [name, 'sdxl']));
    expect(config.modelAliases).toEqual({ ...defaults, 'dall-e-3': 'flux', 'my-model': 'sd15' });
    expect(problems(() => loadConfig({}, { MODEL_ALIASES: 'nonsense' }))[0]).toMatch(/^MODEL_ALIASES/);
    // An alias named twice: one of the two would win without a word.
    expect(problems(() => loadConfig({}, { MODEL_ALIASES: 'dall-e-3=sdxl,dall-e-3=flux' }))[0]).toMatch(/^MODEL_ALIASES.*'dall-e-3' is given more than one model: name each alias once/);
  });

  it("refuses a model's folder or file where a model's id goes (DEFAULT_MODEL, PRELOAD, MODEL_ALIASES), saying how to serve it, for serve and the commands", () => {
    // What sd-server's -m and Xinference's model path take: the server started, and every request said the model does not exist.
    const root = mkdtempSync(path.join(os.tmpdir(), 'imagegen-model-path-'));
    const folder = path.join(root, 'sd15');
    mkdirSync(folder);
    const file = path.join(root, 'v1-5-pruned.safetensors');
    writeFileSync(file, '');
    const howToServe = `name it 'sd15', with MODELS_DIR=${root} to serve it where it is, or once 'imagegen models import ${folder}' installed it into MODELS_DIR`;
    expect(problems(() => loadConfig({}, { DEFAULT_MODEL: folder }))).toEqual([
      `DEFAULT_MODEL names the folder '${folder}', where it takes a model's id (the name of the model's folder): ${howToServe}`,
    ]);
    expect(problems(() => loadModelSettings({}, { DEFAULT_MODEL: folder }))).toEqual([
      `DEFAULT_MODEL names the folder '${folder}', where it takes a model's id (the name of the model's folder): ${howToServe}`,
    ]);
    expect(problems(() => loadConfig({}, { PRELOAD: `demo-shapes,${folder}/`, MODEL_ALIASES: `dall-e-3=${folder}` }))).toEqual([
      `PRELOAD names the folder '${folder}/', where it takes a model's id (the name of the model's folder): name it 'sd15', with MODELS_DIR=${root} to serve it where it is, or once 'imagegen models import ${folder}/' installed it into MODELS_DIR`,
      `MODEL_ALIASES (for 'dall-e-3') names the folder '${folder}', where it takes a model's id (the name of the model's folder): ${howToServe}`,
    ]);
    expect(problems(() => loadConfig({}, { DEFAULT_MODEL: file }))[0]).toMatch(
      new RegExp(`^DEFAULT_MODEL names the file '${file.replace(/[.]/g, '\\.')}', where it takes a model's id .*: a model here is a folder of ONNX graphs, as 'optimum-cli export onnx' writes one`),
    );
    // Ids: a plain name even where a folder of that name is in the working directory, a path that is not there, an alias's name with a slash.
    expect(loadConfig({}, { DEFAULT_MODEL: path.relative(process.cwd(), path.join(process.cwd(), 'models')) }).defaultModel).toBe('models');
    expect(loadConfig({}, { DEFAULT_MODEL: path.join(root, 'absent') }).defaultModel).toBe(path.join(root, 'absent'));
    // Nor a path that cannot be there (under a file: ENOTDIR), or cannot be looked at: not a crash at start.
    expect(loadConfig({}, { DEFAULT_MODEL: path.join(file, 'unet') }).defaultModel).toBe(path.join(file, 'unet'));
    expect(loadModelSettings({}, { DEFAULT_MODEL: `${'x'.repeat(5000)}/unet` }).defaultModel).toBe(`${'x'.repeat(5000)}/unet`);
    expect(loadConfig({}, { DEFAULT_MODEL: 'models/demo-shapes', MODEL_ALIASES: 'models/demo-shapes=demo-shapes' }).defaultModel).toBe('models/demo-shapes');
  });

  it('takes PUBLIC_BASE_URL with or without the /v1 the SDK base URL has', () => {
    expect(loadConfig({}, { PUBLIC_BASE_URL: 'https://img.example.com/v1/' }).publicBaseUrl).toBe('https://img.example.com');
    expect(loadConfig({}, { PUBLIC_BASE_URL: 'https://example.com/gen' }).publicBaseUrl).toBe('https://example.com/gen');
  });

  it('refuses durations longer than a timer can wait (one would fire at once), byte sizes too small to mean what was meant, and keys no client can send', () => {
    for (const name of ['QUEUE_TIMEOUT_SECONDS', 'WORKER_STALL_TIMEOUT_SECONDS', 'SHUTDOWN_TIMEOUT_SECONDS', 'MODELS_RESCAN_SECONDS', 'SEND_TIMEOUT_SECONDS']) {
      expect(problems(() => loadConfig({}, { [name]: '9999999' }))).toEqual([expect.stringMatching(new RegExp(`^${name} .*expected at most 2147483 \\(about 24 days`))]);
    }
    expect(loadConfig({}, { WORKER_STALL_TIMEOUT_SECONDS: '2147483' }).workerStallTimeoutSeconds).toBe(2147483);
    expect(problems(() => loadConfig({}, { MEMORY_LIMIT: '8' }))).toEqual([expect.stringMatching(/^MEMORY_LIMIT .*expected at least 64m \(a number without a unit is bytes: write 8g/)]);
    expect(problems(() => loadConfig({}, { MAX_STORE_BYTES: '0' }))).toEqual([expect.stringMatching(/^MAX_STORE_BYTES .*expected at least 1m/)]);
    expect(problems(() => loadConfig({}, { MODEL_MEMORY_BUDGET: '16' }))).toEqual([expect.stringMatching(/^MODEL_MEMORY_BUDGET .*expected 0 or at least 64m/)]);
    expect(loadConfig({}, { MODEL_MEMORY_BUDGET: '0' }).modelMemoryBudget).toBe(0);
    expect(loadConfig({}, { MEMORY_LIMIT: '8g', MAX_STORE_BYTES: '1m' })).toMatchObject({ memoryLimit: 8 * 1024 ** 3, maxStoreBytes: 1024 ** 2 });
    expect(problems(() => loadConfig({}, { API_KEYS: 'my secret key' }))).toEqual([expect.stringMatching(/^API_KEYS .*without spaces or control characters/)]);
    // Whatever a header carries is a key that works, punctuation included.
    expect(loadConfig({}, { API_KEYS: 'abc!def, p@ss:word' }).apiKeys).toEqual(['abc!def', 'p@ss:word']);
  });

  it('never shows the value of a setting that holds credentials (API_KEYS, REDIS_URL) it refuses, and refuses a REDIS_URL the client could not parse', () => {
    const found = problems(() => loadConfig({}, { API_KEYS: 'sk-good-0001,sk bad-0002', REDIS_URL: 'redis://app:hunter2@redis:99999/0', PORT: 'x' }));
    expect(found).toEqual([
      expect.stringMatching(/^PORT .*\(got 'x'\)$/),
      expect.stringMatching(/^API_KEYS \(--api-keys\): expected keys without spaces or control characters, separated by commas$/),
      expect.stringMatching(/^REDIS_URL \(--redis-url\): expected a valid URL/),
    ]);
    expect(found.join('\n')).not.toMatch(/sk-|hunter2/);
    expect(problems(() => loadConfig({}, { REDIS_URL: 'http://app:hunter2@redis:6379' })).join('\n')).not.toContain('hunter2');
    expect(loadConfig({}, { REDIS_URL: 'rediss://app:p%40ss@redis:6380/1' }).redisUrl).toBe('rediss://app:p%40ss@redis:6380/1');
    // A broken %XX escape parses as a URL, but the client decodes the password and throws at start.
    expect(problems(() => loadConfig({}, { REDIS_URL: 'redis://app:p%zzhunter2@redis:6379' }))).toEqual([expect.stringMatching(/^REDIS_URL \(--redis-url\): expected a valid URL .*%XX\)$/)]);
  });

  it('shows a URL it refuses without its user:password (PUBLIC_BASE_URL and S3_ENDPOINT refuse credentials, and must not print them)', () => {
    const found = problems(() => loadConfig({}, { PUBLIC_BASE_URL: 'https://u:hunter2@x.example.com/imgs', S3_ENDPOINT: 'http://minio:p@ss/hunter2@minio:9000?x' }));
    expect(found).toEqual([
      expect.stringMatching(/^S3_ENDPOINT .*user:password@.* \(got 'http:\/\/\[redacted\]@minio:9000\?x'\)$/),
      expect.stringMatching(/^PUBLIC_BASE_URL .*user:password@.* \(got 'https:\/\/\[redacted\]@x\.example\.com\/imgs'\)$/),
    ]);
    expect(found.join('\n')).not.toContain('hunter2');
  });

  it('names an origin it refuses in CORS_ORIGINS without its user:password', () => {
    const found = problems(() => loadConfig({}, { CORS_ORIGINS: 'https://app.example.com,https://u:hunter2@x.example.com' }));
    expect(found).toEqual([expect.stringMatching(/^CORS_ORIGINS .*'https:\/\/\[redacted\]@x\.example\.com' is not an origin/)]);
    expect(found.join('\n')).not.toContain('hunter2');
  });

  it('refuses a PUBLIC_BASE_URL that image paths cannot follow: a query, fragment, credentials or spaces', () => {
    for (const url of ['https://x.example.com/imgs?x=1', 'https://x.example.com/imgs#frag', 'https://u:p@x.example.com/imgs', 'https://x.example.com/im gs', 'https://x.example.com/imgs?', 'https://x.example.com/imgs#']) {
      expect([url, problems(() => loadConfig({}, { PUBLIC_BASE_URL: url }))[0]]).toEqual([url, expect.stringMatching(/^PUBLIC_BASE_URL .*without spaces, query/)]);
    }
  });
});

describe('settingsHelp (serve --help)', () => {
  it("shows each setting's default as one would write it, and writing it changes nothing", () => {
    const shown = Object.fromEntries(settingsHelp.map((s) => [s.env, s.defaultText]));
    expect(shown).toMatchObject({ PORT: '8000', HOST: '127.0.0.1', MAX_STORE_BYTES: '2g', BODY_LIMIT: '1m', LOG_PROMPTS: 'false', CUDA_DEVICES: '0', STORE: 'fs' });
    // None where there is none (API_KEYS), or where the description says what it depends on.
    expect(shown).toMatchObject({ API_KEYS: undefined, WORKERS: undefined, CORS_ORIGINS: undefined, DEFAULT_MODEL: undefined });
    const defaults = loadConfig({}, {});
    for (const setting of settingsHelp.filter((s) => s.defaultText !== undefined)) {
      const written = loadConfig({}, { [setting.env]: setting.defaultText });
      expect({ env: setting.env, value: written[setting.name as keyof typeof written] }).toEqual({ env: setting.env, value: defaults[setting.name as keyof typeof defaults] });
    }
  });
});
