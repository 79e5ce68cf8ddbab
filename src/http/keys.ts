import { createHash, timingSafeEqual } from 'node:crypto';
import { unwatchFile, watchFile } from 'node:fs';
import { readFile } from 'node:fs/promises';
import type { FastifyBaseLogger } from 'fastify';
import { isSendableKey } from '../api/bearer.js';
import { imageOwner } from '../store/image-owner.js';
import { messageOf, whyUnreadable } from '../util/error-message.js';
import { utf16Problem } from '../util/files.js';

/**
 * The API keys: API_KEYS from the configuration plus API_KEYS_FILE, which is re-read when it changes
 * (or on reload(), which the auth plugin calls on SIGHUP) without a restart. A key is looked up in
 * constant time and named everywhere by its label; the key itself never leaves this module but to
 * be compared.
 *
 * API_KEYS_FILE has one key a line, `[label:]key [limit=value ...]`; blank lines and lines starting with
 * `#` are skipped. The first ':' ends the label, so a key with a ':' needs a label before it; what a key
 * may be is api/bearer.ts's rule, as for API_KEYS. Limits (all optional, whole numbers >= 1, each at most
 * once a line):
 * requests_per_minute, images_per_minute, concurrent. Example:
 *
 *     # team, key, limits
 *     alice:sk-alice-7f3a9c images_per_minute=60 concurrent=2
 *     sk-batch-jobs-91b2
 */

/** Per-key limits as API_KEYS_FILE states them (enforced by key-rates.ts and, for `concurrent`, the queue). */
export interface KeyLimits {
  /** Generation requests per minute. */
  requestsPerMinute?: number;
  /** Images per minute (the sum of the requests' n). */
  imagesPerMinute?: number;
  /**
   * Generations running at once: batches on each server (the queue's maxConcurrent) and, with
   * REDIS_URL, requests over all the servers (http/key-slots.ts). More wait their turn.
   */
  concurrent?: number;
}

export interface ApiKey {
  /**
   * How logs, limits and the queue name the key: its label in API_KEYS_FILE, else `sha256:` and the start
   * of its digest there (stable when lines move, unlike a line number; names nothing of the key), or
   * where it was configured (`API_KEYS[2]`).
   */
  label: string;
  key: string;
  /** Whose images the key's url requests store (store/image-owner.ts's imageOwner): an id that names neither the key nor its label. */
  owner: string;
  limits?: KeyLimits;
}

/** An API_KEYS_FILE that cannot be used; the message names lines, never keys. */
export class KeyFileError extends Error {
  constructor(file: string, problems: string[]) {
    super(`API_KEYS_FILE ${file}: ${problems.join('; ')}`);
    this.name = 'KeyFileError';
  }
}

const LIMIT_NAMES = { requests_per_minute: 'requestsPerMinute', images_per_minute: 'imagesPerMinute', concurrent: 'concurrent' } as const;
const LABEL = /^[A-Za-z0-9._@/-]{1,64}$/;

/** Comparing fixed-size digests keeps the comparison's time independent of the key and of its length. */
const digest = (key: string) => createHash('sha256').update(key).digest();

/**
 * How an error names a word after a line's key that is not a limit: the word itself only when it is
 * shaped as one (a limit's name with a bad value, or `name=digits`). Anything else may be a key: two
 * keys on one line, or the rest of a key with a space in it, must not reach the log; it is named by
 * its place on the line instead.
 */
function shownSetting(setting: string, word: number): string {
  const [, name, value] = /^([^=]*)=(.*)$/.exec(setting) ?? [];
  const limitShaped = name !== undefined && (Object.hasOwn(LIMIT_NAMES, name) || (/^[a-z_]{1,40}$/.test(name) && /^\d{0,12}$/.test(value)));
  return limitShaped ? `'${setting}'` : `word ${word} (not shown: it may be a key)`;
}

/** Reads API_KEYS_FILE's text; throws KeyFileError naming every bad line. */
export function parseKeyFile(text: string, file: string): ApiKey[] {
  const keys: ApiKey[] = [];
  const problems: string[] = [];
  text.split(/\r?\n/).forEach((line, index) => {
    const [first, ...settings] = line.trim().split(/\s+/);
    if (!first || first.startsWith('#')) return;
    const where = `line ${index + 1}`;
    const colon = first.indexOf(':');
    const key = colon < 0 ? first : first.slice(colon + 1);
    const label = colon < 0 ? `sha256:${digest(key).toString('hex').slice(0, 12)}` : first.slice(0, colon);
    if (colon >= 0 && !LABEL.test(label)) problems.push(`${where}: the label must be 1 to 64 letters, digits or ._@/-`);
    if (!isSendableKey(key)) problems.push(`${where}: the key must be printable characters without spaces`);
    // A comment after a key and its limits (`# team a`) is no limit, nor are its words: said once, as such.
    const comment = settings.findIndex((setting) => setting.startsWith('#'));
    if (comment >= 0) problems.push(`${where}: word ${comment + 2} starts a comment, and a comment takes a line of its own (a line starting with #)`);
    const limits: KeyLimits = {};
    settings.slice(0, comment < 0 ? undefined : comment).forEach((setting, i) => {
      const match = /^([a-z_]+)=([1-9]\d{0,8})$/.exec(setting);
      const field = match && LIMIT_NAMES[match[1] as keyof typeof LIMIT_NAMES];
      if (!match || !field) {
        problems.push(`${where}: ${shownSetting(setting, i + 2)} is not a limit: expected ${Object.keys(LIMIT_NAMES).join('=N, ')}=N with N a whole number >= 1 (a key has no spaces)`);
      } else if (limits[field] !== undefined) {
        problems.push(`${where}: ${match[1]} is given twice`);
      } else limits[field] = Number(match[2]);
    });
    keys.push({ label, key, owner: imageOwner(key), ...(Object.keys(limits).length > 0 && { limits }) });
  });
  const seen = new Set<string>();
  for (const { label } of keys) {
    if (seen.has(label)) problems.push(`the label '${label}' is used twice`);
    seen.add(label);
  }
  if (new Set(keys.map((k) => k.key)).size !== keys.length) problems.push('a key is listed twice');
  if (problems.length > 0) throw new KeyFileError(file, problems);
  return keys;
}

/**
 * API_KEYS_FILE's text; throws KeyFileError when it cannot be read, saying what to do and what the file
 * holds: an operator who set the path before writing the file learns its format here.
 */
async function readKeyText(file: string): Promise<string> {
  const data = await readFile(file).catch((err: unknown) => {
    const create = (err as NodeJS.ErrnoException).code === 'ENOENT' ? 'create it, or ' : '';
    throw new KeyFileError(file, [
      `${whyUnreadable(err)}: ${create}set API_KEYS_FILE (--api-keys-file) to a file the server may read that holds the keys, one a line as '[label:]key [limit=value ...]' (docs/security.md#keys)`,
    ]);
  });
  const problem = utf16Problem(data);
  if (problem) throw new KeyFileError(file, [problem]);
  return data.toString('utf8');
}

/** Reads and parses API_KEYS_FILE; throws KeyFileError when it cannot be read or has bad lines. */
export async function readKeyFile(file: string): Promise<ApiKey[]> {
  return parseKeyFile(await readKeyText(file), file);
}

/** How often API_KEYS_FILE is checked for changes: polling sees editors' renames and Kubernetes' symlink swaps alike. */
const POLL_INTERVAL_MS = 1000;

/** How long a changed API_KEYS_FILE must stay the same before it is used (see KeyRing.readSettled). */
const SETTLE_MS = 250;
/** Reads of a changing file before its last is used all the same (a file rewritten without end). */
const SETTLE_READS = 8;

export interface KeyRingOptions {
  apiKeys: string[];
  apiKeysFile?: string;
  logger: FastifyBaseLogger;
  /** See SETTLE_MS; the tests' own. */
  settleMs?: number;
}

export class KeyRing {
  private entries: { digest: Buffer; key: ApiKey }[] = [];
  private reloading: Promise<void> = Promise.resolve();
  private readonly fixed: ApiKey[];
  private readonly onChange = () => void this.reload();

  private constructor(private readonly options: KeyRingOptions) {
    this.fixed = options.apiKeys.map((key, i) => ({ label: `API_KEYS[${i + 1}]`, key, owner: imageOwner(key) }));
  }

  /** Reads the keys; a bad API_KEYS_FILE fails here, at start, rather than locking everyone out later. */
  static async open(options: KeyRingOptions): Promise<KeyRing> {
    const ring = new KeyRing(options);
    ring.use(await ring.readFile());
    if (options.apiKeysFile) watchFile(options.apiKeysFile, { interval: POLL_INTERVAL_MS }, ring.onChange);
    return ring;
  }

  /** Whether keys are required at all. A configured file counts even when empty: then nobody gets in. */
  get enabled(): boolean {
    return this.fixed.length > 0 || this.options.apiKeysFile !== undefined;
  }

  /** The key sent, if it is one of ours. Every key is compared, with no early exit. */
  find(sent: string): ApiKey | undefined {
    const sentDigest = digest(sent);
    return this.entries.reduce<ApiKey | undefined>((found, entry) => (timingSafeEqual(entry.digest, sentDigest) ? entry.key : found), undefined);
  }

  /**
   * Re-reads API_KEYS_FILE once it stays the same (see readSettled); when it cannot be read or parsed,
   * the keys in use stay and the log says why.
   */
  reload(): Promise<void> {
    this.reloading = this.reloading.then(async () => {
      try {
        this.use(await this.readSettled());
        this.options.logger.info({ keys: this.entries.map((e) => e.key.label) }, 'API keys reloaded');
      } catch (err) {
        this.options.logger.error(`${messageOf(err)}; keeping the ${this.entries.length} keys in use`);
      }
    });
    return this.reloading;
  }

  close(): void {
    if (this.options.apiKeysFile) unwatchFile(this.options.apiKeysFile, this.onChange);
  }

  private async readFile(): Promise<ApiKey[]> {
    return this.options.apiKeysFile ? readKeyFile(this.options.apiKeysFile) : [];
  }

  /**
   * API_KEYS_FILE once two reads SETTLE_MS apart agree. A file written in place (an editor that saves
   * so, `echo ... > keys.txt`) is empty, or cut short, from its truncation until its write ends; read
   * then, it was a valid key file with no keys, or fewer, and their clients were refused until the next
   * poll. The keys in use serve meanwhile.
   */
  private async readSettled(): Promise<ApiKey[]> {
    const file = this.options.apiKeysFile;
    if (!file) return [];
    let text = await readKeyText(file);
    for (let read = 1; read < SETTLE_READS; read++) {
      await new Promise((resolve) => setTimeout(resolve, this.options.settleMs ?? SETTLE_MS));
      const again = await readKeyText(file);
      if (again === text) break;
      text = again;
    }
    return parseKeyFile(text, file);
  }

  private use(fromFile: ApiKey[]): void {
    this.entries = [...this.fixed, ...fromFile].map((key) => ({ digest: digest(key.key), key }));
    // A file of no keys locks everyone out (it never opens the server): said, or the operator sees only
    // clients' 401s for keys that look right, and a log with nothing about it.
    if (this.entries.length === 0 && this.options.apiKeysFile) {
      this.options.logger.warn(`API_KEYS_FILE ${this.options.apiKeysFile} holds no keys: every request that needs one gets 401 until a key is added to it (it is re-read as it changes)`);
    }
  }
}
