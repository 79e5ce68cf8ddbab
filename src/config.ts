import { statSync, type Stats } from 'node:fs';
import { isIP } from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { z } from 'zod';
import { EXECUTION_PROVIDERS, GRAPH_REWRITE_SETS } from './runtime/providers.js';
import { NOISE_KINDS } from './runtime/random.js';
import { isLoopbackAddress } from './util/loopback.js';
import { parseUrl, withoutCredentials } from './util/url.js';
import type { VaeTilingMode } from './pipelines/memory-plan.js';
import { isSendableKey } from './api/bearer.js';
import { OPENAI_MODEL_NAMES } from './api/dialects.js';
import { ConfigError } from './util/config-error.js';
import { unexpandedHome } from './util/home-path.js';
import { shellWord } from './util/shell-word.js';

/**
 * Server configuration. Every setting has one name from which its environment variable (UPPER_SNAKE)
 * and its CLI flag (--kebab-case) are derived, so the two can never drift apart; a flag wins over the
 * variable. Secure by default: without API keys the server only listens on loopback.
 */

/** The `models/` folder shipped with the package (holds the demo model); always searched. */
export const EMBEDDED_MODELS_DIR = fileURLToPath(new URL('../models/', import.meta.url));

/** Whether HOST (its brackets already stripped) listens on loopback only: localhost, or a loopback address. */
const isLoopback = (host: string): boolean => host === 'localhost' || isLoopbackAddress(host);

const BYTE_UNITS: Record<string, number> = { '': 1, k: 1024, m: 1024 ** 2, g: 1024 ** 3 };

/** "1048576", "512k", "64m", "2g" (binary units). */
const byteSize = z
  .string()
  .regex(/^\d+\s*[kmg]?i?b?$/i, 'expected a byte count such as 1048576, 512k, 64m or 2g')
  .transform((text) => {
    const [, digits, unit] = /^(\d+)\s*([kmg]?)/i.exec(text)!;
    return Number(digits) * BYTE_UNITS[unit.toLowerCase()];
  });

/** A file's or folder's path; one beginning with a `~` no shell expanded (an environment file's) is refused, naming the path meant. */
const filePath = z
  .string()
  .min(1)
  .superRefine((value, ctx) => {
    const problem = unexpandedHome(value);
    if (problem) ctx.addIssue({ code: 'custom', message: problem });
  });

/** How a true/false setting (and TRUST_PROXY's true or false) may be written. */
const TRUE_TEXT = /^(true|1|yes)$/i;
const FALSE_TEXT = /^(false|0|no)$/i;

const boolean = z
  .string()
  .refine((text) => TRUE_TEXT.test(text) || FALSE_TEXT.test(text), 'expected true or false')
  .transform((text) => TRUE_TEXT.test(text));

const integer = (min: number, max = Number.MAX_SAFE_INTEGER) => {
  // The range in the settings table's words, not zod's "Too big: expected number to be <=64".
  const range = max === Number.MAX_SAFE_INTEGER ? `expected at least ${min}` : `expected ${min} to ${max}`;
  return z.string().regex(/^\d+$/, 'expected a whole number').transform(Number).pipe(z.number().min(min, range).max(max, range));
};

/** IMAGE_TTL_SECONDS at most: 100 years. */
const MAX_IMAGE_TTL_SECONDS = 100 * 365.25 * 86_400;

/** The longest Node's timers wait (2^31 - 1 ms): a longer one fires at once instead. */
const MAX_TIMER_SECONDS = Math.floor((2 ** 31 - 1) / 1000);

/** A duration a timer waits, in whole seconds; `min` 0 where 0 means "never" (the setting says). */
const seconds = (min: number) =>
  z
    .string()
    .regex(/^\d+$/, 'expected a whole number of seconds')
    .transform(Number)
    .pipe(z.number().min(min, `expected at least ${min}`).max(MAX_TIMER_SECONDS, `expected at most ${MAX_TIMER_SECONDS} (about 24 days, the longest a timer waits)`));

/** A byte size of at least `min` bytes, whose error says that a bare number is bytes. */
const bytesAtLeast = (min: number, unit: string) =>
  byteSize.pipe(z.number().min(min, `expected at least ${unit} (a number without a unit is bytes: write 8g for 8 GiB)`));

/** "a, b,,c" -> ['a', 'b', 'c']. */
const commaItems = (text: string): string[] =>
  text
    .split(',')
    .map((item) => item.trim())
    .filter(Boolean);

const list = z.string().transform(commaItems);

/** "dall-e-3=sdxl,gpt-image-1=flux" -> { 'dall-e-3': 'sdxl', ... }; an empty target removes an alias. */
const aliasList = z
  .string()
  .regex(/^\s*([^=,\s]+\s*=\s*[^=,\s]*\s*)(,\s*[^=,\s]+\s*=\s*[^=,\s]*\s*)*$/, 'expected alias=model pairs separated by commas')
  .transform((text, ctx) => {
    const pairs = text.split(',').map((pair) => pair.split('=').map((part) => part.trim()) as [string, string]);
    // Named twice, one of the two would win without a word.
    const twice = pairs.map(([alias]) => alias).find((alias, i, aliases) => aliases.indexOf(alias) !== i);
    if (twice !== undefined) {
      ctx.addIssue({ code: 'custom', message: `'${twice}' is given more than one model: name each alias once` });
      return z.NEVER;
    }
    return Object.fromEntries(pairs) as Record<string, string>;
  });

/** An origin as browsers send it in `Origin` (scheme, host, port); "*" for any. */
function asOrigin(text: string): string | undefined {
  if (text === '*') return text;
  const url = parseUrl(text);
  if (!url) return undefined;
  const bare = url.pathname === '/' && !url.search && !url.hash && !url.username;
  return bare && /^https?:$/.test(url.protocol) ? url.origin : undefined;
}

/** "https://app.example.com,http://localhost:5173" or "*"; each normalised as browsers write origins. */
const originList = list.pipe(
  z.array(
    z.string().transform((text, ctx) => {
      const origin = asOrigin(text);
      if (origin === undefined) {
        // Shown as shownValue shows a URL: an origin with a user:password@ is refused, and must not print them.
        ctx.addIssue({ code: 'custom', message: `'${withoutCredentials(text)}' is not an origin: expected * or origins such as https://app.example.com or http://localhost:5173 (scheme, host, port; no path)` });
        return z.NEVER;
      }
      return origin;
    }),
  ),
);

/** proxy-addr's names for address ranges (Fastify's trustProxy understands them). */
const PROXY_RANGE_NAMES = new Set(['loopback', 'linklocal', 'uniquelocal']);

/** "10.0.0.5", "10.0.0.0/8", "fd00::/8" or one of proxy-addr's range names. */
function isProxyAddress(text: string): boolean {
  if (PROXY_RANGE_NAMES.has(text)) return true;
  const [address, bits, ...rest] = text.split('/');
  const version = isIP(address);
  if (version === 0 || rest.length > 0) return false;
  return bits === undefined || (/^\d{1,3}$/.test(bits) && Number(bits) <= (version === 4 ? 32 : 128));
}

/** TRUST_PROXY: true/false, or the addresses and CIDR ranges of the proxies to trust. */
const proxyTrust = z.string().transform((text, ctx): boolean | string[] => {
  // To Express and Fastify a number is a hop count (trust the last n proxies): 1, read as true like the
  // other switches, trusted every address a client wrote in X-Forwarded-For, and the log named that.
  if (/^\d+$/.test(text) && !FALSE_TEXT.test(text)) {
    ctx.addIssue({ code: 'custom', message: 'expected the proxies\' addresses or CIDR ranges (e.g. 127.0.0.1,10.0.0.0/8), or true to trust every peer: a hop count is not taken' });
    return z.NEVER;
  }
  if (TRUE_TEXT.test(text)) return true;
  if (FALSE_TEXT.test(text)) return false;
  const entries = commaItems(text);
  const wrong = entries.filter((entry) => !isProxyAddress(entry));
  if (wrong.length > 0) {
    ctx.addIssue({
      code: 'custom',
      message: `${wrong.map((w) => `'${w}'`).join(', ')}: expected false, true, or proxy addresses and CIDR ranges such as 127.0.0.1,10.0.0.0/8 (or loopback, linklocal, uniquelocal)`,
    });
    return z.NEVER;
  }
  return entries;
});

const absoluteUrl = z
  .url({ protocol: /^https?$/, error: 'expected an absolute http(s) URL such as https://images.example.com' })
  // Paths are appended to it: a query, fragment or credentials would end up in the middle of every URL.
  .refine((url) => {
    const parsed = parseUrl(url);
    // Not a URL at all: the check above says so.
    if (!parsed) return true;
    const { search, hash, username, password } = parsed;
    // A bare trailing ? or # parses as no query or fragment, and would still end up before the paths.
    return !/[\s?#]/.test(url) && !search && !hash && !username && !password;
  }, 'expected an address without spaces, query (?), fragment (#) or user:password@, such as https://images.example.com/prefix')
  // Users often paste the SDK's base URL (ending in /v1); the image paths add /v1 themselves.
  .transform((url) => url.replace(/\/+$/, '').replace(/\/v1$/, ''));

/** Whether the Redis client reads the URL: it parses it as a URL, then decodes its user and password, where a broken %XX escape throws. */
function redisCanRead(url: string): boolean {
  const parsed = parseUrl(url);
  if (!parsed) return false;
  const { username, password } = parsed;
  try {
    decodeURIComponent(username);
    decodeURIComponent(password);
    return true;
  } catch {
    return false;
  }
}

/**
 * The settings, in the order `--help` lists them. Optional ones without a default stay undefined.
 * The descriptions are the user documentation of each setting.
 */
const SETTINGS = {
  port: { schema: integer(0, 65535).default(8000), description: 'TCP port to listen on (0 picks a free one)' },
  host: {
    // An IPv6 address as URLs write it ([::1]) is what Node's listen() cannot resolve.
    schema: z.string().min(1).default('127.0.0.1').transform((host) => host.replace(/^\[(.*)\]$/, '$1')),
    description: 'interface to listen on; anything but loopback requires API_KEYS or API_KEYS_FILE',
  },
  apiKeys: {
    schema: list
      .refine((keys) => keys.every(isSendableKey), 'expected keys without spaces or control characters, separated by commas')
      .default([]),
    description: 'comma-separated API keys clients send as "Authorization: Bearer <key>" (prefer the env variable: flags show in ps)',
  },
  apiKeysFile: {
    schema: filePath.optional(),
    description:
      'file of API keys, one a line as [label:]key [requests_per_minute=N] [images_per_minute=N] [concurrent=N], # comments; re-read when it changes and on SIGHUP (see docs/security.md)',
  },
  dataDir: { schema: filePath.default('./data'), description: 'folder of the image store (generated images served by URL) and of the memory each model measured (read and kept by generate and models verify too)' },
  modelsDir: { schema: filePath.optional(), description: 'folder of installed models, one sub-folder per model (the embedded models/ is always searched too)' },
  defaultModel: {
    schema: z.string().min(1).default('demo-shapes'),
    description: 'model of requests that name none, and the one the OpenAI model names resolve to (default: the embedded demo model)',
  },
  rng: {
    schema: z.enum(NOISE_KINDS).default('native'),
    description: 'noise generator of requests that set no "rng": native (ours) or torch (the noise of torch.Generator("cpu").manual_seed(seed), so seeds give diffusers\' pictures)',
  },
  modelAliases: {
    schema: aliasList.optional(),
    description: `extra or changed model aliases, e.g. "dall-e-3=sdxl,dall-e-2=" (empty target removes one); ${OPENAI_MODEL_NAMES.join(', ')} default to DEFAULT_MODEL`,
  },
  corsOrigins: {
    schema: originList.default([]),
    description:
      'comma-separated web origins whose pages may call the API from a browser (CORS), e.g. https://app.example.com, or * for any (only with API keys); with keys the pages still need one (default: none, browsers refuse cross-origin calls)',
  },
  modelsRescanSeconds: { schema: seconds(0).default(30), description: 'how often model folders are rescanned for added or removed models (0 = only on demand)' },
  // Bounded where an image's expiry is still a date: beyond, an S3 upload's Expires was an invalid one.
  imageTtlSeconds: { schema: integer(1, MAX_IMAGE_TTL_SECONDS).default(86400), description: 'how long image URLs stay valid (at most 100 years)' },
  maxStoreBytes: {
    schema: bytesAtLeast(1024 ** 2, '1m').prefault('2g'),
    description: 'space the image store may use, e.g. 2g (each image counts at least 4 KiB, the least a file takes on disk; with STORE=s3: the prefix\'s total over all replicas, as each replica\'s last listing saw it; see docs/deploy.md)',
  },
  store: {
    schema: z.enum(['fs', 's3']).default('fs'),
    description: 'where generated images live: fs (DATA_DIR/images on this machine) or s3 (an S3-compatible bucket every replica shares; see the S3_* settings)',
  },
  s3Bucket: { schema: z.string().min(1).optional(), description: 'bucket of the image store with STORE=s3' },
  s3Prefix: { schema: z.string().default('images/'), description: 'key prefix of the images in S3_BUCKET (deployments sharing a bucket need different ones)' },
  s3Endpoint: {
    schema: absoluteUrl.optional(),
    description: 'S3 API address of stores other than AWS, e.g. http://minio:9000 or https://<account>.r2.cloudflarestorage.com (default: AWS, or AWS_ENDPOINT_URL_S3)',
  },
  s3Region: { schema: z.string().min(1).optional(), description: 'bucket region (default: AWS_REGION or the AWS profile\'s; MinIO and most others take us-east-1, R2 auto)' },
  s3ForcePathStyle: {
    schema: boolean.default(false),
    description: 'address the bucket as a path (http://host/bucket/key) rather than a host name: MinIO, Ceph RGW, Garage and most self-hosted stores need true',
  },
  s3PresignedUrls: {
    schema: boolean.default(false),
    description: 'image URLs are presigned S3 URLs that expire with the image (clients fetch from the bucket, which they must reach), instead of URLs any replica serves',
  },
  redisUrl: {
    // Parsed here as the client will parse it: a URL it refuses made it throw at start with the URL, password and all, in the log.
    schema: z
      .string()
      .regex(/^rediss?:\/\//, 'expected a redis:// or rediss:// URL, e.g. redis://redis:6379/0')
      .refine(redisCanRead, 'expected a valid URL (a port 1-65535; characters of a user or password that URLs reserve written as %XX)')
      .optional(),
    description: 'Redis shared by the replicas for the per-key limits of API_KEYS_FILE (e.g. redis://redis:6379/0; rediss:// for TLS); unset: each server counts alone',
  },
  publicBaseUrl: {
    schema: absoluteUrl.optional(),
    description: 'external address of this server for image URLs (default: taken from each request)',
  },
  trustProxy: {
    schema: proxyTrust.default(false),
    description:
      'honour X-Forwarded-Proto/-Host/-For from these proxies: comma-separated addresses or CIDR ranges (e.g. 127.0.0.1,10.0.0.0/8), or true for any peer (default: false, the headers are ignored)',
  },
  workers: {
    schema: integer(1, 64).optional(),
    description: 'generation worker processes, each with its own copy of the models (default: one per CUDA device, one on WebGPU, one on the CPU, fewer if the models measured more memory than is free)',
  },
  workerThreads: {
    schema: integer(1, 1024).optional(),
    description:
      "onnxruntime's CPU threads in each worker (default: the cores shared out among the workers); fewer leave cores to other programs, more than that share out oversubscribes the cores (see docs/performance.md)",
  },
  executionProvider: {
    schema: z.enum(EXECUTION_PROVIDERS).default('cpu'),
    description: "onnxruntime execution provider: cpu, cuda (NVIDIA, needs 'npm run install:cuda') or webgpu (any GPU with a Vulkan, Direct3D 12 or Metal driver)",
  },
  ortThreadSpinning: {
    schema: boolean.default(false),
    description: "let onnxruntime's CPU threads spin-wait for work between operators (faster only with cores to spare: on a busy machine the spinning takes the cores from the other threads and workers)",
  },
  graphRewrites: {
    schema: z.enum(GRAPH_REWRITE_SETS).default('all'),
    description:
      "how exported graphs are rewritten as they load: all (on the CPU, each SD/SDXL/FLUX attention layer becomes onnxruntime's fused MultiHeadAttention, several times faster at large sizes and without the [tokens x tokens] scores in memory, within 1e-6 of the exported graph) or exact (only the rewrites that keep the exported graph's values bit for bit)",
  },
  workerNice: {
    schema: integer(0, 19).default(10),
    description:
      "how far below the server's the workers' CPU priority is (a Unix nice increment, 0 to 19): with every core denoising, the server still answers health probes, streams and new requests at once, and idle cores go to the workers all the same",
  },
  mallocHugePages: {
    schema: boolean.default(true),
    description:
      "the workers' malloc backs large blocks with transparent huge pages where the kernel gives them on request (GLIBC_TUNABLES glibc.malloc.hugetlb=1; a GLIBC_TUNABLES of your own that sets it wins): the VAE's activations, allocated afresh for every decode, cost far less CPU to fault in (see docs/performance.md)",
  },
  modelMemoryBudget: {
    // 0 keeps only the model in use; a small number is a unit forgotten (16 meaning 16g).
    schema: byteSize.pipe(z.number().refine((bytes) => bytes === 0 || bytes >= 64 * 1024 ** 2, 'expected 0 or at least 64m (a number without a unit is bytes: write 16g for 16 GiB)')).optional(),
    description: "model weights all workers together keep loaded, e.g. 16g; beyond it the least recently used model is unloaded (default: 60% of RAM; on CUDA 60% of the memory of the GPUs the workers use, from nvidia-smi, per device)",
  },
  memoryLimit: {
    schema: bytesAtLeast(64 * 1024 ** 2, '64m').optional(),
    description:
      'memory the running batches of all workers may plan to take together on top of their loaded models, e.g. 8g (default: what the machine has free), of which they plan on 90% (headroom for what a plan cannot see); a batch waits for memory another batch planned on, one that does not fit runs in parts of as many images as fit, and one whose single image is expected to need more than there is gets 507 insufficient_memory instead of running out of memory',
  },
  vaeTiling: {
    schema: z
      .string()
      .refine(
        (text) => {
          const side = Number(text);
          return text === 'auto' || text === 'always' || (/^\d+$/.test(text) && side >= 256 && side <= 4096 && side % 64 === 0);
        },
        { error: 'expected auto, always, or the side of the tiles in pixels: a multiple of 64 from 256 to 4096' },
      )
      .transform((text): VaeTilingMode => (text === 'auto' || text === 'always' ? text : Number(text)))
      .default('auto'),
    description:
      "when the VAE decodes in overlapping tiles: 'auto' only where the whole decode would not fit memory (the picture is then diffusers' exactly), 'always' every image with a side over 512 pixels (less memory; faster where the decoder's attention dominates, as in small exports at large sizes), or a number of pixels: as always, in tiles of that side",
  },
  cudaDevices: {
    // Written as the other lists are ("0, 1" too); each item a device id.
    schema: list
      .pipe(z.array(z.string().regex(/^\d+$/, 'expected device ids separated by commas, e.g. 0,1').transform(Number)).min(1, 'expected device ids separated by commas, e.g. 0,1'))
      .default([0]),
    description: 'CUDA device ids; worker i runs on device i mod their count (with EXECUTION_PROVIDER=cuda)',
  },
  queueMax: { schema: integer(0).default(64), description: 'generation jobs that may wait for a worker before requests get 429' },
  queueMaxSeconds: {
    schema: integer(0).default(600),
    description:
      'estimated seconds of generation work that may wait per worker before new requests get 429 with a Retry-After from the work ahead (each model\'s speed is measured as it runs; 0 = no limit)',
  },
  queueTimeoutSeconds: {
    schema: seconds(1).default(120),
    description: 'longest a request may wait for its first batch to get a worker (including while workers load models) before it gets 503 queue_timeout; its later batches never time out, unless one handed to a worker that died before running it has to wait again',
  },
  workerStallTimeoutSeconds: {
    schema: seconds(0).default(600),
    description:
      'a worker whose batch makes no progress (no denoising step done, no model loaded) for this long is killed and replaced, failing that batch with 500 (0 = never)',
  },
  preload: {
    schema: list.optional(),
    description: 'comma-separated models (ids or aliases) every worker loads at start, before /ready says ready (default: DEFAULT_MODEL; "none" loads nothing)',
  },
  shutdownTimeoutSeconds: {
    schema: seconds(0).default(30),
    description: 'on SIGTERM/SIGINT, how long running requests may finish before they are cancelled with a retryable 503',
  },
  uploadMemory: {
    // At least the largest form an edit takes (an image and a mask of 50 MiB, fields: 109 MiB): one always
    // fits. The default's half, a key's share, holds one too, and the other half another key's.
    schema: bytesAtLeast(128 * 1024 ** 2, '128m').prefault('256m'),
    description:
      'memory request bodies (the uploaded files of edits and variations, JSON bodies) may take together, from their first byte until their request ends (a request waiting for a worker keeps its upload); a body that finds it full gets 429 with Retry-After before the rest of it is read; one API key holds at most half of it (or the largest body a request may send, where that is more)',
  },
  answerMemory: {
    // Several of the largest answers a request gets, unread at once, for each of two keys: the largest
    // size the presets serve, 1792x1024 (1.8 megapixels), is at most about 5.5 MB as a PNG (3 bytes a
    // pixel, an image without flat areas; the embedded model's are under 1 MB), 7.3 MB in base64, so
    // n=10 is 73 MB, and a key's half of 1 GiB holds seven such answers (about ten of photos at 2
    // bytes a pixel). A client that reads at network speed gives its answer back within seconds. Such
    // a request sets aside 86 MB while it is made (service/answer-size.ts): six at once per key.
    schema: bytesAtLeast(64 * 1024 ** 2, '64m').prefault('1g'),
    description:
      'memory the answers that carry their images (b64_json, streamed events) may take together until their clients have read them; a request whose API key holds half of it in unread answers, or that finds it full, gets 429 with Retry-After before any work is done for it; each request sets aside the most its answer may take before its work is queued, waiting up to QUEUE_TIMEOUT_SECONDS for room, then 429 (url answers hold none)',
  },
  bodyLimit: {
    schema: byteSize.pipe(z.number().min(1, 'expected at least 1 byte')).prefault('1m'),
    description: 'largest accepted request body, e.g. 1m; a compressed body counts decompressed; at most UPLOAD_MEMORY',
  },
  headersTimeoutSeconds: {
    schema: seconds(1).default(30),
    description: 'a connection must send a request\'s headers within this long (also a new connection\'s first request), or it gets 408 and is closed',
  },
  requestTimeoutSeconds: {
    schema: seconds(1).default(60),
    description: 'a request (headers and body) must arrive within this long, or it gets 408 and is closed; the generation after it is not limited by this',
  },
  sendTimeoutSeconds: {
    schema: seconds(1).default(60),
    description: 'once an answer is being sent, a client that takes none of it for this long has its connection reset (it would hold the answer in memory)',
  },
  sendMinRate: {
    schema: byteSize.prefault('16k'),
    description:
      'bytes per second a client must at least take of an answer waiting for it, over each SEND_TIMEOUT_SECONDS, or its connection is reset: one taking a little now and then would hold the answer in memory for as long as it likes (0 = no minimum)',
  },
  streamKeepAliveSeconds: {
    schema: seconds(1).default(15),
    description: "a streamed answer sends a keep-alive comment line after this long without an event (keep it below a proxy's idle timeout, which would otherwise end a stream that waits for a worker)",
  },
  maxConnections: {
    schema: integer(1).default(4096),
    description:
      'most client connections open at once (idle keep-alive ones and streams included); one past it is reset as it arrives (clients see a connection error, which the OpenAI SDKs retry), logged and counted in imagegen_connections_dropped_total: bounds what many idle or slow clients can hold',
  },
  keepAliveTimeoutSeconds: {
    schema: seconds(1).default(72),
    description: 'an idle keep-alive connection is closed after this long (keep it above a load balancer\'s idle timeout)',
  },
  tlsCert: { schema: filePath.optional(), description: 'PEM certificate file: serve HTTPS (needs TLS_KEY)' },
  tlsKey: { schema: filePath.optional(), description: 'PEM private key file for TLS_CERT' },
  metricsPublic: { schema: boolean.default(false), description: 'serve GET /metrics without an API key' },
  playground: {
    schema: boolean.default(true),
    description: 'serve the playground web page at / and /playground/ (the page itself loads without a key; the API calls it makes need one)',
  },
  logLevel: {
    schema: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
    description: 'log level',
  },
  logPrompts: { schema: boolean.default(false), description: 'log the prompts of generation requests (they are private to the user: off by default)' },
} satisfies Record<string, { schema: z.ZodType; description: string }>;

export type SettingName = keyof typeof SETTINGS;

/** Settings holding credentials: an error about one never shows its value (it goes to the terminal and the log). */
const SECRET_SETTINGS: ReadonlySet<SettingName> = new Set(['apiKeys', 'redisUrl']);

/**
 * How the terminal and the log may show a setting's value: not at all for a credential setting; a URL
 * without its user and password (PUBLIC_BASE_URL and S3_ENDPOINT refuse them, and an error must not
 * show them either).
 */
function showable(name: SettingName, value: string): string | undefined {
  return SECRET_SETTINGS.has(name) ? undefined : withoutCredentials(value);
}

/** How an error shows a value it refuses (see showable). */
function shownValue(name: SettingName, value: string | undefined): string {
  const shown = value === undefined ? undefined : showable(name, value);
  return shown === undefined ? '' : ` (got '${shown}')`;
}

/** The settings as their schemas give them. */
type Settings = z.output<z.ZodObject<{ [K in SettingName]: (typeof SETTINGS)[K]['schema'] }>>;

export interface Config extends Omit<Settings, 'modelAliases' | 'preload'> {
  /** Alias -> model id, defaults merged with MODEL_ALIASES. */
  modelAliases: Record<string, string>;
  /** Models (ids or aliases) to load at start; empty for none. */
  preload: string[];
}

/** A setting's environment variable, e.g. modelsDir -> MODELS_DIR. */
export const envName = (name: SettingName) => name.replace(/[A-Z]/g, (c) => `_${c}`).toUpperCase();
const flagName = (name: SettingName) => `--${name.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`;

/** Whether a setting's schema is `boolean` (with a default or not). */
const isBoolean = (schema: z.ZodType): boolean => schema === boolean || (schema instanceof z.ZodDefault && schema.unwrap() === boolean);

/**
 * A setting's value when neither its flag nor its variable is set, as help shows it: its schema's
 * default, as written where the default is text to parse (a prefault: byte sizes read 2g, not
 * 2147483648); undefined where there is none, or where the description says what it depends on
 * ("(default: ...").
 */
function defaultText(setting: { schema: z.ZodType; description: string }): string | undefined {
  if (setting.description.includes('(default:')) return undefined;
  if (setting.schema instanceof z.ZodPrefault) return String(setting.schema.def.defaultValue);
  const parsed = setting.schema.safeParse(undefined);
  const value: unknown = parsed.success ? parsed.data : undefined;
  if (Array.isArray(value)) return value.length > 0 ? value.join(',') : undefined;
  return ['string', 'number', 'boolean'].includes(typeof value) ? String(value) : undefined;
}

/** A setting's default as text (see defaultText), for a command that takes the setting as its own flag (`models list --data-dir`). */
export function settingDefault(name: SettingName): string | undefined {
  return defaultText(SETTINGS[name]);
}

/** Each setting's flag, variable, description and default, for the CLI's options and help. */
export const settingsHelp = (Object.keys(SETTINGS) as SettingName[]).map((name) => ({
  name,
  flag: flagName(name),
  env: envName(name),
  description: SETTINGS[name].description,
  defaultText: settingDefault(name),
  /** A true/false setting: its flag alone (`--log-prompts`) means true. */
  isSwitch: isBoolean(SETTINGS[name].schema),
}));

/** A setting's value as written (a flag's or a variable's): spaces around it dropped, and empty read as unset. */
export const settingText = (text: string | undefined): string | undefined => text?.trim() || undefined;

/** The text a setting was given: its flag's, else its variable's (settingText). */
const givenText = (name: SettingName, flags: Partial<Record<SettingName, string>>, env: NodeJS.ProcessEnv): string | undefined =>
  settingText(flags[name] ?? env[envName(name)]);

/**
 * The settings given (by flag or variable) as a log line shows them, by variable: what an operator set,
 * in a line at start that says the server read it (a value changed in a unit file or a compose file and
 * a restart), and what it left at its default by its absence. Credentials are left out, and URLs lose
 * their user and password, as errors show them (shownValue).
 */
export function givenSettings(flags: Partial<Record<SettingName, string>>, env: NodeJS.ProcessEnv = process.env): Record<string, string> {
  return Object.fromEntries(
    (Object.keys(SETTINGS) as SettingName[]).flatMap((name) => {
      const text = givenText(name, flags, env);
      return text === undefined ? [] : [[envName(name), showable(name, text) ?? '[redacted]']];
    }),
  );
}

/**
 * Parses the named settings from CLI flag values (commander's camelCase keys, strings) over environment
 * variables. Empty values count as unset. Throws ConfigError listing every invalid one, each named by its
 * variable and, where the command takes it as a flag (`flagged`), its flag: a flag named by a command
 * that has none (generate's MEMORY_LIMIT) sent the user to an option the command refuses as unknown.
 */
function parseSettings<K extends SettingName>(
  names: readonly K[],
  flags: Partial<Record<SettingName, string>>,
  env: NodeJS.ProcessEnv,
  flagged: readonly SettingName[] = names,
): Pick<Settings, K> {
  const raw = Object.fromEntries(names.map((name) => [name, givenText(name, flags, env)]));
  const result = z.object(Object.fromEntries(names.map((name) => [name, SETTINGS[name].schema]))).safeParse(raw);
  if (!result.success) {
    throw new ConfigError(
      result.error.issues.map((issue) => {
        const name = issue.path[0] as K;
        const flag = flagged.includes(name) ? ` (${flagName(name)})` : '';
        return `${envName(name)}${flag}: ${issue.message}${shownValue(name, raw[name])}`;
      }),
    );
  }
  // The object of exactly these settings' schemas, whose output zod's types cannot follow for a generic
  // list of names.
  return result.data as unknown as Pick<Settings, K>;
}

/** The settings only STORE=s3 reads; each has its default (none, false, S3_PREFIX's images/) unless given. */
const S3_ONLY = ['s3Bucket', 's3Prefix', 's3Endpoint', 's3Region', 's3ForcePathStyle', 's3PresignedUrls'] as const satisfies readonly SettingName[];

/** The OpenAI names pointing to DEFAULT_MODEL, with MODEL_ALIASES over them (an empty target removes one). */
function aliasesOf({ defaultModel, modelAliases }: Pick<Settings, 'defaultModel' | 'modelAliases'>): Record<string, string> {
  const aliases: Record<string, string> = Object.fromEntries(OPENAI_MODEL_NAMES.map((name) => [name, defaultModel]));
  for (const [alias, target] of Object.entries(modelAliases ?? {})) {
    if (target) aliases[alias] = target;
    else delete aliases[alias];
  }
  return aliases;
}

/**
 * A setting that takes a model's id (the name of its folder) given a path to a folder or a file instead,
 * as sd-server's `-m` and Xinference's model path take one: no id has a path separator in it, so the
 * server would start and fail every request for the model, saying only that it does not exist. Refused
 * saying how to serve that folder. A value with a separator that is an alias's name is an id.
 */
function modelPathProblems({ defaultModel, modelAliases = {}, preload = [] }: Pick<Settings, 'defaultModel' | 'modelAliases'> & Partial<Pick<Settings, 'preload'>>): string[] {
  const named: [setting: string, value: string][] = [
    ['DEFAULT_MODEL', defaultModel],
    ...preload.map((name): [string, string] => ['PRELOAD', name]),
    ...Object.entries(modelAliases).map(([alias, target]): [string, string] => [`MODEL_ALIASES (for '${alias}')`, target]),
  ];
  return named.flatMap(([setting, value]) => {
    if (!/[\\/]/.test(value) || Object.hasOwn(modelAliases, value)) return [];
    const found = statOf(value);
    if (!found) return [];
    const id = path.basename(path.resolve(value));
    return found.isDirectory()
      ? [
          `${setting} names the folder '${value}', where it takes a model's id (the name of the model's folder): name it '${id}', ` +
            `with MODELS_DIR=${shellWord(path.dirname(path.resolve(value)))} to serve it where it is, or once 'imagegen models import ${shellWord(value)}' installed it into MODELS_DIR`,
        ]
      : [
          `${setting} names the file '${value}', where it takes a model's id (the name of the model's folder): a model here is a folder of ONNX graphs, ` +
            "as 'optimum-cli export onnx' writes one from a checkpoint; install that folder with 'imagegen models import <folder>' and name it by its id (README: Real models)",
        ];
  });
}

/** The file or folder at `value`, if one is there to see: a path under a file (ENOTDIR), too long, or behind a folder not ours to read is none, and an id as any other. */
function statOf(value: string): Stats | undefined {
  try {
    return statSync(value, { throwIfNoEntry: false });
  } catch {
    return undefined;
  }
}

/** What the commands that run models without serving them (generate, models verify) read; DATA_DIR for the memory figures a server keeps there. */
const MODEL_SETTINGS = ['modelsDir', 'defaultModel', 'modelAliases', 'rng', 'executionProvider', 'workerThreads', 'memoryLimit', 'graphRewrites', 'dataDir'] as const;
export type ModelSettings = Pick<Config, (typeof MODEL_SETTINGS)[number]>;

/**
 * The settings of commands that run models without serving them: only these are read and checked, so a
 * server's settings in the same environment (HOST=0.0.0.0 set for `serve`, say) cannot stop them.
 * `flags` has a key for each of them the command takes as a flag, given or not (generate's
 * `{ modelsDir }`); the others are read from the environment alone, and their errors name the variable only.
 */
export function loadModelSettings(
  flags: Partial<Record<(typeof MODEL_SETTINGS)[number], string | undefined>> = {},
  env: NodeJS.ProcessEnv = process.env,
): ModelSettings {
  const parsed = parseSettings(MODEL_SETTINGS, flags, env, Object.keys(flags) as SettingName[]);
  const paths = modelPathProblems(parsed);
  if (paths.length) throw new ConfigError(paths);
  return { ...parsed, modelAliases: aliasesOf(parsed) };
}

/**
 * Reads the server's configuration (see parseSettings). Throws ConfigError listing every invalid
 * setting (the checks across settings run once each setting is valid).
 */
export function loadConfig(flags: Partial<Record<SettingName, string>> = {}, env: NodeJS.ProcessEnv = process.env): Config {
  const parsed = parseSettings(Object.keys(SETTINGS) as SettingName[], flags, env);
  const problems: string[] = [];
  const loopback = isLoopback(parsed.host);
  if (!loopback && parsed.apiKeys.length === 0 && !parsed.apiKeysFile) {
    problems.push(
      `HOST is ${parsed.host} but no API_KEYS or API_KEYS_FILE are set: refusing to serve without authentication beyond this machine. ` +
        'Set API_KEYS=<key1,key2> (or API_KEYS_FILE=<file>) or listen on HOST=127.0.0.1.',
    );
  }
  // Without keys, a page's Origin is all that keeps other sites off (http/local-only.ts): "*" would let
  // every page that a browser on this machine opens use the server and read its answers, no key asked.
  if (parsed.corsOrigins.includes('*') && parsed.apiKeys.length === 0 && !parsed.apiKeysFile) {
    problems.push(
      'CORS_ORIGINS is * but no API_KEYS or API_KEYS_FILE are set: every web page opened in a browser on this machine could use the server without a key. ' +
        'Name the origins of the pages to allow (e.g. CORS_ORIGINS=http://localhost:5173), or set API_KEYS.',
    );
  }
  if (parsed.headersTimeoutSeconds > parsed.requestTimeoutSeconds) {
    problems.push('HEADERS_TIMEOUT_SECONDS must not exceed REQUEST_TIMEOUT_SECONDS: the headers are part of the request');
  }
  // A JSON body is held in UPLOAD_MEMORY as it arrives (http/body-memory.ts): one larger than all of it
  // would get 429 with Retry-After for good, however long its client waited.
  if (parsed.bodyLimit > parsed.uploadMemory) {
    problems.push('BODY_LIMIT must not exceed UPLOAD_MEMORY: a JSON body is held in UPLOAD_MEMORY as it arrives, so a larger one could never be read; raise UPLOAD_MEMORY too');
  }
  if (Boolean(parsed.tlsCert) !== Boolean(parsed.tlsKey)) problems.push('TLS_CERT and TLS_KEY must be set together');
  if (parsed.store === 's3' && !parsed.s3Bucket) problems.push('STORE=s3 needs S3_BUCKET (and credentials from the AWS environment variables or files)');
  // One set without STORE=s3 is a STORE forgotten: the file store would keep the images on this machine, where no other replica serves them.
  // Set to its default (S3_FORCE_PATH_STYLE=false, S3_PREFIX=images/) changes nothing, and is no STORE forgotten.
  const s3Settings = S3_ONLY.filter((name) => parsed[name] !== undefined && String(parsed[name]) !== settingDefault(name)).map(envName);
  if (parsed.store !== 's3' && s3Settings.length) {
    problems.push(`${s3Settings.join(', ')} need${s3Settings.length > 1 ? '' : 's'} STORE=s3: set it, or unset ${s3Settings.length > 1 ? 'them' : 'it'} to keep images in DATA_DIR/images (STORE=fs)`);
  }
  // SigV4 presigned URLs live at most 7 days.
  if (parsed.s3PresignedUrls && parsed.imageTtlSeconds > 604_800) problems.push('S3_PRESIGNED_URLS allows IMAGE_TTL_SECONDS of at most 604800 (7 days, the longest a presigned URL lives)');
  problems.push(...modelPathProblems(parsed));
  // 'none' beside models read as a model of that name, which no folder has: every worker failed to preload it.
  if ((parsed.preload?.length ?? 0) > 1 && parsed.preload?.some(isNone)) problems.push("PRELOAD lists 'none' (load nothing) among models: set PRELOAD=none alone, or list only the models to load");
  if (problems.length) throw new ConfigError(problems);

  const preload = parsed.preload ?? [parsed.defaultModel];
  return {
    ...parsed,
    modelAliases: aliasesOf(parsed),
    preload: preload.length === 1 && isNone(preload[0]) ? [] : preload,
  };
}

/** PRELOAD's word for loading nothing. */
const isNone = (id: string) => id.toLowerCase() === 'none';
