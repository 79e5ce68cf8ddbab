import { fileURLToPath } from 'node:url';
import { z } from 'zod';

/**
 * Server configuration. Every setting has one name from which its environment variable (UPPER_SNAKE)
 * and its CLI flag (--kebab-case) are derived, so the two can never drift apart; a flag wins over the
 * variable. Secure by default: without API keys the server only listens on loopback.
 */

/** The `models/` folder shipped with the package (holds the demo model); always searched. */
export const EMBEDDED_MODELS_DIR = fileURLToPath(new URL('../models/', import.meta.url));

/** OpenAI model names that apps hard-code; by default they all resolve to DEFAULT_MODEL. */
const OPENAI_MODEL_NAMES = ['dall-e-2', 'dall-e-3', 'gpt-image-1'] as const;

const LOOPBACK_HOSTS = new Set(['localhost', '::1', '[::1]']);

function isLoopback(host: string): boolean {
  return LOOPBACK_HOSTS.has(host) || /^127(\.\d{1,3}){3}$/.test(host);
}

const BYTE_UNITS: Record<string, number> = { '': 1, k: 1024, m: 1024 ** 2, g: 1024 ** 3 };

/** "1048576", "512k", "64m", "2g" (binary units). */
const byteSize = z
  .string()
  .regex(/^\d+\s*[kmg]?i?b?$/i, 'expected a byte count such as 1048576, 512k, 64m or 2g')
  .transform((text) => {
    const [, digits, unit] = /^(\d+)\s*([kmg]?)/i.exec(text)!;
    return Number(digits) * BYTE_UNITS[unit.toLowerCase()];
  });

const boolean = z
  .string()
  .regex(/^(true|false|1|0|yes|no)$/i, 'expected true or false')
  .transform((text) => /^(true|1|yes)$/i.test(text));

const integer = (min: number, max = Number.MAX_SAFE_INTEGER) =>
  z.string().regex(/^\d+$/, 'expected a whole number').transform(Number).pipe(z.number().min(min).max(max));

const list = z.string().transform((text) =>
  text
    .split(',')
    .map((item) => item.trim())
    .filter(Boolean),
);

/** "dall-e-3=sdxl,gpt-image-1=flux" -> { 'dall-e-3': 'sdxl', ... }; an empty target removes an alias. */
const aliasList = z
  .string()
  .regex(/^\s*([^=,\s]+\s*=\s*[^=,\s]*\s*)(,\s*[^=,\s]+\s*=\s*[^=,\s]*\s*)*$/, 'expected alias=model pairs separated by commas')
  .transform((text) => Object.fromEntries(text.split(',').map((pair) => pair.split('=').map((part) => part.trim()))) as Record<string, string>);

const absoluteUrl = z
  .url({ protocol: /^https?$/, error: 'expected an absolute http(s) URL such as https://images.example.com' })
  // Users often paste the SDK's base URL (ending in /v1); the image paths add /v1 themselves.
  .transform((url) => url.replace(/\/+$/, '').replace(/\/v1$/, ''));

/**
 * The settings, in the order `--help` lists them. Optional ones without a default stay undefined.
 * The descriptions are the user documentation of each setting.
 */
const SETTINGS = {
  port: { schema: integer(0, 65535).default(8000), description: 'TCP port to listen on (0 picks a free one)' },
  host: {
    schema: z.string().min(1).default('127.0.0.1'),
    description: 'interface to listen on; anything but loopback requires API_KEYS',
  },
  apiKeys: {
    schema: list.default([]),
    description: 'comma-separated API keys clients send as "Authorization: Bearer <key>" (prefer the env variable: flags show in ps)',
  },
  dataDir: { schema: z.string().min(1).default('./data'), description: 'folder of the image store (generated images served by URL)' },
  modelsDir: { schema: z.string().min(1).optional(), description: 'folder of installed models, one sub-folder per model (the embedded models/ is always searched too)' },
  defaultModel: { schema: z.string().min(1).default('demo-shapes'), description: 'model that the OpenAI model names resolve to' },
  modelAliases: {
    schema: aliasList.optional(),
    description: `extra or changed model aliases, e.g. "dall-e-3=sdxl,dall-e-2=" (empty target removes one); ${OPENAI_MODEL_NAMES.join(', ')} default to DEFAULT_MODEL`,
  },
  modelsRescanSeconds: { schema: integer(0).default(30), description: 'how often model folders are rescanned for added or removed models (0 = only on demand)' },
  imageTtlSeconds: { schema: integer(1).default(86400), description: 'how long image URLs stay valid' },
  maxStoreBytes: { schema: byteSize.default(2 * 1024 ** 3), description: 'disk space the image store may use, e.g. 2g' },
  publicBaseUrl: {
    schema: absoluteUrl.optional(),
    description: 'external address of this server for image URLs (default: taken from each request)',
  },
  trustProxy: {
    schema: boolean.optional(),
    description: 'honour X-Forwarded-Proto/-Host/-For from a reverse proxy (default: true when HOST is loopback)',
  },
  workers: { schema: integer(1, 64).default(1), description: 'generation worker processes (each loads its own copy of a model)' },
  executionProvider: { schema: z.enum(['cpu', 'cuda']).default('cpu'), description: 'onnxruntime execution provider: cpu or cuda' },
  modelMemoryBudget: {
    schema: byteSize.optional(),
    description: 'model weights all workers together keep loaded, e.g. 16g; beyond it the least recently used model is unloaded (default: 60% of RAM)',
  },
  cudaDevices: {
    schema: z.string().regex(/^\d+(,\d+)*$/, 'expected device ids separated by commas, e.g. 0,1').transform((t) => t.split(',').map(Number)).default([0]),
    description: 'CUDA device ids; worker i runs on device i mod their count (with EXECUTION_PROVIDER=cuda)',
  },
  queueMax: { schema: integer(0).default(64), description: 'generation jobs that may wait for a worker before requests get 429' },
  queueTimeoutSeconds: {
    schema: integer(1).default(120),
    description: 'longest a request may wait for a worker (including while workers load models) before it gets 503 queue_timeout',
  },
  workerStallTimeoutSeconds: {
    schema: integer(0).default(600),
    description:
      'a worker whose batch makes no progress (no denoising step done, no model loaded) for this long is killed and replaced, failing that batch with 500 (0 = never)',
  },
  preload: {
    schema: list.optional(),
    description: 'comma-separated models (ids or aliases) every worker loads at start, before /ready says ready (default: DEFAULT_MODEL; "none" loads nothing)',
  },
  shutdownTimeoutSeconds: {
    schema: integer(0).default(30),
    description: 'on SIGTERM/SIGINT, how long running requests may finish before they are cancelled with a retryable 503',
  },
  bodyLimit: { schema: byteSize.default(1024 ** 2), description: 'largest accepted request body, e.g. 1m' },
  tlsCert: { schema: z.string().min(1).optional(), description: 'PEM certificate file: serve HTTPS (needs TLS_KEY)' },
  tlsKey: { schema: z.string().min(1).optional(), description: 'PEM private key file for TLS_CERT' },
  metricsPublic: { schema: boolean.default(false), description: 'serve GET /metrics without an API key' },
  logLevel: {
    schema: z.enum(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']).default('info'),
    description: 'log level',
  },
  logPrompts: { schema: boolean.default(false), description: 'log the prompts of generation requests (they are private to the user: off by default)' },
} satisfies Record<string, { schema: z.ZodType; description: string }>;

export type SettingName = keyof typeof SETTINGS;

const settingsSchema = z.object(Object.fromEntries(Object.entries(SETTINGS).map(([name, s]) => [name, s.schema])) as {
  [K in SettingName]: (typeof SETTINGS)[K]['schema'];
});

export interface Config extends Omit<z.output<typeof settingsSchema>, 'modelAliases' | 'trustProxy' | 'preload'> {
  /** Alias -> model id, defaults merged with MODEL_ALIASES. */
  modelAliases: Record<string, string>;
  trustProxy: boolean;
  /** Models (ids or aliases) to load at start; empty for none. */
  preload: string[];
}

/** A setting's environment variable, e.g. modelsDir -> MODELS_DIR. */
export const envName = (name: SettingName) => name.replace(/[A-Z]/g, (c) => `_${c}`).toUpperCase();
const flagName = (name: SettingName) => `--${name.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`;

/** Each setting's flag, variable and description, for the CLI's options and help. */
export const settingsHelp = (Object.keys(SETTINGS) as SettingName[]).map((name) => ({
  name,
  flag: flagName(name),
  env: envName(name),
  description: SETTINGS[name].description,
}));

export class ConfigError extends Error {
  constructor(readonly problems: string[]) {
    super(`Invalid configuration:\n${problems.map((p) => `  - ${p}`).join('\n')}`);
    this.name = 'ConfigError';
  }
}

/**
 * Reads the configuration: CLI flag values (commander's camelCase keys, strings) over environment
 * variables. Empty values count as unset. Throws ConfigError listing every invalid setting (the checks
 * across settings run once each setting is valid).
 */
export function loadConfig(flags: Partial<Record<SettingName, string>> = {}, env: NodeJS.ProcessEnv = process.env): Config {
  const raw = Object.fromEntries(
    (Object.keys(SETTINGS) as SettingName[]).map((name) => [name, (flags[name] ?? env[envName(name)])?.trim() || undefined]),
  );
  const result = settingsSchema.safeParse(raw);
  if (!result.success) {
    throw new ConfigError(
      result.error.issues.map((issue) => {
        const name = issue.path[0] as SettingName;
        return `${envName(name)} (${flagName(name)}): ${issue.message}${raw[name] === undefined ? '' : ` (got '${raw[name]}')`}`;
      }),
    );
  }
  const parsed = result.data;
  const problems: string[] = [];
  const loopback = isLoopback(parsed.host);
  if (!loopback && parsed.apiKeys.length === 0) {
    problems.push(
      `HOST is ${parsed.host} but no API_KEYS are set: refusing to serve without authentication beyond this machine. ` +
        'Set API_KEYS=<key1,key2> or listen on HOST=127.0.0.1.',
    );
  }
  if (Boolean(parsed.tlsCert) !== Boolean(parsed.tlsKey)) problems.push('TLS_CERT and TLS_KEY must be set together');
  if (problems.length) throw new ConfigError(problems);

  const modelAliases: Record<string, string> = Object.fromEntries(OPENAI_MODEL_NAMES.map((name) => [name, parsed.defaultModel]));
  for (const [alias, target] of Object.entries(parsed.modelAliases ?? {})) {
    if (target) modelAliases[alias] = target;
    else delete modelAliases[alias];
  }
  const preload = parsed.preload ?? [parsed.defaultModel];
  return {
    ...parsed,
    modelAliases,
    trustProxy: parsed.trustProxy ?? loopback,
    preload: preload.length === 1 && preload[0].toLowerCase() === 'none' ? [] : preload,
  };
}
