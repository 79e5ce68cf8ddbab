import { createHash } from 'node:crypto';
import { lstat, readdir, stat } from 'node:fs/promises';
import path from 'node:path';
import type { Logger } from 'pino';
import { exists } from '../util/files.js';
import { shellWord } from '../util/shell-word.js';
import { MODEL_INDEX } from './layout.js';
import { inspectModelFolder, notesOf, OVERRIDE_FILE, type UnusableModel, type UsableModel } from './model-folder.js';

/**
 * The installed models: one sub-folder per model under each models folder, its id the folder name.
 * Folders are rescanned periodically and when a request names an unknown model, so models can be added
 * and removed without a restart. Unusable folders are logged (once per change), skipped, and listed
 * with their reason for /ready.
 */

/** An installed model: what inspectModelFolder found its folder usable as, and where it comes from. */
export interface ModelEntry extends Omit<UsableModel, 'usable'> {
  id: string;
  /** Unix seconds: when the folder was last changed. */
  created: number;
  /** Changes whenever a file of the folder other than imagegen.json changes, so workers reload rather than keep old sessions. */
  version: string;
  ownedBy: string;
}

export interface ModelsRoot {
  dir: string;
  /** `owned_by` of its models in /v1/models. */
  ownedBy: string;
}

export interface RegistryOptions {
  /** Searched in order; a model id found in an earlier root hides the same id in later ones. */
  roots: ModelsRoot[];
  /** Alias -> model id (OpenAI's model names -> local models). */
  aliases: Record<string, string>;
  logger: Logger;
  /** Requests for unknown models rescan at most this often. */
  minRescanIntervalMs?: number;
}

/** A models folder's modification time, undefined when it cannot be read (missing, or not a folder). */
async function rootTime(dir: string): Promise<number | undefined> {
  return stat(dir).then(
    (folder) => folder.mtimeMs,
    () => undefined,
  );
}

/** One listed model: an installed one, or an alias (then `id` is the alias). */
export interface ListedModel {
  id: string;
  model: ModelEntry;
}

/** A model folder the server skips, and why (inspectModelFolder's reason). */
export interface UnusableFolder {
  id: string;
  dir: string;
  reason: string;
}

/**
 * Why a model found nowhere may be installed all the same: one installed with `models import --models-dir`
 * (or MODELS_DIR set in another shell) is found only where that folder is searched.
 */
export const NO_MODELS_DIR = 'MODELS_DIR is not set, so only the models that come with imagegen are searched';

/** The user's models folder first (its models hide embedded ones of the same id), then the embedded one. */
export function modelRoots(modelsDir: string | undefined, embeddedDir: string): ModelsRoot[] {
  return [...(modelsDir ? [{ dir: path.resolve(modelsDir), ownedBy: 'user' }] : []), { dir: embeddedDir, ownedBy: 'imagegen' }];
}

interface Inspection {
  id: string;
  /** Changes whenever a file in the folder changes (see folderSignature). */
  signature: string;
  result: ModelEntry | UnusableModel;
}

/** The model folders in a models root, sorted: folders or links to them, not hidden ones (staging, partial pulls). */
export async function modelFolderNames(root: string): Promise<string[]> {
  const entries = await readdir(root, { withFileTypes: true });
  return entries
    .filter((entry) => (entry.isDirectory() || entry.isSymbolicLink()) && !entry.name.startsWith('.'))
    .map((entry) => entry.name)
    .sort();
}

/**
 * Why a models folder is no such folder, when it is a model folder itself (it has model_index.json):
 * its sub-folders are that model's parts, not models. The server's log and `models list` say this
 * rather than one broken "model" per component.
 */
export async function modelFolderAsRoot(root: string): Promise<string | undefined> {
  if (!(await exists(path.join(root, MODEL_INDEX)))) return undefined;
  return (
    `the models folder ${root} is a model folder itself (it has ${MODEL_INDEX}; its sub-folders are that model's parts): ` +
    `point MODELS_DIR at the folder that holds model folders, one per model (such as ${path.dirname(path.resolve(root))}), or install this one into yours with "imagegen models import ${shellWord(root)}"`
  );
}

/** Deep enough for every layout (component folders, Optimum's onnx/ and tokenizer_2/ within them). */
const SIGNATURE_DEPTH = 3;

/**
 * The size and mtime of every file in the folder, down to SIGNATURE_DEPTH: a few dozen stats for an
 * export, and they catch what the folder's own mtime does not: a file rewritten in place (weights
 * replaced, a config edited, a copy whose last file was still being written at the last scan).
 * `weights` leaves imagegen.json out: its presets are the server's, and editing them must not make
 * every worker load the model's sessions again.
 */
async function folderSignature(dir: string): Promise<{ signature: string; weights: string; mtimeMs: number }> {
  const own = await stat(dir);
  const files: string[] = [];
  const visit = async (rel: string, depth: number) => {
    for (const name of (await readdir(path.join(dir, rel))).sort()) {
      const child = rel ? `${rel}/${name}` : name;
      const info = await stat(path.join(dir, child)).catch(() => undefined); // a link to nothing: inspection says so
      if (info?.isDirectory() && depth < SIGNATURE_DEPTH) await visit(child, depth + 1);
      files.push(`${child}:${info?.size}:${info?.mtimeMs}`);
    }
  };
  await visit('', 1);
  const weights = files.filter((entry) => !entry.startsWith(`${OVERRIDE_FILE}:`)).join('|');
  return { signature: files.join('|'), weights, mtimeMs: own.mtimeMs };
}

/** A folder's version (ModelEntry.version) from its signature's `weights`. */
const versionOf = (weights: string) => createHash('sha256').update(weights).digest('hex').slice(0, 16);

/** The version of a model folder's files as a scan finds it (ModelEntry.version): to tell whose memory figures are whose outside the server (`models list`). */
export async function folderVersion(dir: string): Promise<string> {
  return versionOf((await folderSignature(dir)).weights);
}

async function inspect(id: string, dir: string, ownedBy: string, mtimeMs: number, version: string): Promise<ModelEntry | UnusableModel> {
  const verdict = await inspectModelFolder(dir);
  if (!verdict.usable) return verdict;
  const { layout, preset, schedulers, refusedSchedulers, capabilities } = verdict;
  return { id, layout, preset, schedulers, refusedSchedulers, capabilities, created: Math.floor(mtimeMs / 1000), version, ownedBy };
}

/** An UnusableModel says `usable: false`; a ModelEntry has no such field. */
const isUsable = (result: ModelEntry | UnusableModel): result is ModelEntry => !('usable' in result);

export class ModelRegistry {
  private models = new Map<string, ModelEntry>();
  private readonly inspections = new Map<string, Inspection>();
  /** Roots that could not be read at the last scan, with why (said once per why), and roots that are a model folder (said once). */
  private readonly rootProblems = new Map<string, string>();
  private readonly misplacedRoots = new Set<string>();
  private scanning: Promise<void> | undefined;
  /** When the last scan ended, on the monotonic clock: a wall-clock step back would hold off scans on request for as long as the step. */
  private lastScan = -Infinity;
  /**
   * Each root's modification time as the last finished scan began (undefined: missing): a folder installed
   * since changes it. Kept only once the scan's models are: taken as a scan began, the requests beside the
   * one whose rescan it was found the folder unchanged and answered the models from before it, the old
   * version of one replaced by "models import --force" among them.
   */
  private scannedRoots = new Map<string, number | undefined>();
  private timer: NodeJS.Timeout | undefined;
  private readonly minRescanIntervalMs: number;

  constructor(private readonly options: RegistryOptions) {
    this.minRescanIntervalMs = options.minRescanIntervalMs ?? 2000;
  }

  /** Rescans all roots; concurrent callers share one scan. */
  scan(): Promise<void> {
    this.scanning ??= this.scanRoots().finally(() => {
      this.scanning = undefined;
      this.lastScan = performance.now();
    });
    return this.scanning;
  }

  /** Rescans every `intervalMs` (0: never) until close(). */
  startRescanning(intervalMs: number): void {
    if (intervalMs <= 0) return;
    this.timer = setInterval(() => {
      this.scan().catch((err) => this.options.logger.error({ err }, 'model rescan failed'));
    }, intervalMs);
    this.timer.unref();
  }

  close(): void {
    clearInterval(this.timer);
  }

  /**
   * Rescans unless the last scan is more recent than minRescanIntervalMs and no root changed since it
   * (a model installed or removed renames a folder in its root): a request right after `models pull` or
   * `import` finds the model, while a flood of unknown names costs a stat of each root, not a listing.
   */
  async refresh(): Promise<void> {
    if (performance.now() - this.lastScan >= this.minRescanIntervalMs || (await this.rootsChanged())) await this.scan();
  }

  private async rootsChanged(): Promise<boolean> {
    const now = await Promise.all(this.options.roots.map((root) => rootTime(root.dir)));
    return this.options.roots.some((root, i) => now[i] !== this.scannedRoots.get(root.dir));
  }

  /**
   * The model an id or alias names, rescanning first (rate-limited) when it is unknown, or when a models
   * folder changed since the last scan: a model replaced by "models import --force" (or "pull --force")
   * is renamed in whole, and until a rescan its old entry, the old version's presets and sessions, went
   * on answering (for good with MODELS_RESCAN_SECONDS=0). A stat of each root per request. An installed
   * model's id wins over an alias of the same name, here as in list(): the scan logs such an alias.
   */
  async resolve(id: string): Promise<ModelEntry | undefined> {
    const named = () => this.models.get(this.aliasTarget(id) ?? id);
    if (!named() || (await this.rootsChanged())) await this.refresh();
    return named();
  }

  /** The version of the usable model in `dir` as the last scan found it; undefined when there is none. */
  versionOf(dir: string): string | undefined {
    for (const model of this.models.values()) if (model.layout.dir === dir) return model.version;
    return undefined;
  }

  /** Installed models by id, then the aliases whose model is installed. */
  list(): ListedModel[] {
    const installed = [...this.models.values()].sort((a, b) => a.id.localeCompare(b.id)).map((model) => ({ id: model.id, model }));
    const aliases = Object.entries(this.options.aliases)
      .filter(([alias, target]) => this.models.has(target) && !this.models.has(alias))
      .map(([alias, target]) => ({ id: alias, model: this.models.get(target)! }));
    return [...installed, ...aliases];
  }

  /** The model id the alias `id` names, installed or not; undefined when `id` is no alias (or an installed model's own id, which wins). */
  aliasTarget(id: string): string | undefined {
    return !this.models.has(id) && Object.hasOwn(this.options.aliases, id) ? this.options.aliases[id] : undefined;
  }

  /** Why `id`, or the model the alias `id` names, is installed and skipped: undefined when it is not. */
  unusableReason(id: string): string | undefined {
    const target = this.aliasTarget(id) ?? id;
    return this.unusable().find((folder) => folder.id === target)?.reason;
  }

  /**
   * Why `id` (an alias: its target) resolves to no model, for the log: its folder installed but skipped,
   * with the reason, or none installed. "Not installed" of a model just imported sent its operator to
   * install it again, to be told that it exists.
   */
  whyNone(id: string): string {
    const reason = this.unusableReason(id);
    if (reason) return `is installed but cannot be used (${reason})`;
    return this.searchesModelsDir() ? 'is not installed' : `is not installed (${NO_MODELS_DIR})`;
  }

  /** Whether a models folder of the user's (MODELS_DIR) is searched, besides the models that come with imagegen. */
  searchesModelsDir(): boolean {
    return this.options.roots.some((root) => root.ownedBy === 'user');
  }

  /** The folders the last scan skipped, by id, with the reason each was skipped. */
  unusable(): UnusableFolder[] {
    return [...this.inspections]
      .flatMap(([dir, { id, result }]) => (isUsable(result) ? [] : [{ id, dir, reason: result.reason }]))
      .sort((a, b) => a.id.localeCompare(b.id));
  }

  private async scanRoots(): Promise<void> {
    const { logger } = this.options;
    // Read before the listings: a folder installed while they run changes the time again, and is seen at the next request.
    const times = await Promise.all(this.options.roots.map((root) => rootTime(root.dir)));
    const found = new Map<string, ModelEntry>();
    const seen = new Set<string>();
    /** Ids an earlier root has, usable or not: a user's broken copy of the demo model hides the embedded one rather than fall back to it unsaid. */
    const claimed = new Set<string>();
    for (const root of this.options.roots) {
      let names: string[];
      try {
        names = await modelFolderNames(root.dir);
        this.rootProblems.delete(root.dir);
        const misplaced = await modelFolderAsRoot(root.dir);
        if (misplaced && !this.misplacedRoots.has(root.dir)) logger.warn({ dir: root.dir }, misplaced);
        if (misplaced) this.misplacedRoots.add(root.dir);
        else this.misplacedRoots.delete(root.dir);
        // Its components are no models: each would only be skipped, with a warning of its own.
        if (misplaced) continue;
      } catch (err) {
        const { code = 'unknown', message } = err as NodeJS.ErrnoException;
        // Said once, not at every rescan (every 30 s), until the folder is read or fails another way.
        if (this.rootProblems.get(root.dir) !== code) {
          this.rootProblems.set(root.dir, code);
          // The reason in the message itself: `imagegen generate` shows only the message (a file named as the folder: ENOTDIR).
          const problem =
            code === 'ENOENT'
              ? `does not exist: none of its models are served until it does ("imagegen models pull" or "import" creates it; check MODELS_DIR)`
              : `cannot be read (${message}): none of its models are served until it can; check MODELS_DIR`;
          logger.warn({ ...(code !== 'ENOENT' && { err }), dir: root.dir }, `the models folder ${root.dir} ${problem}`);
        }
        continue;
      }
      for (const id of names) {
        if (claimed.has(id)) continue; // hidden by an earlier root
        const dir = path.resolve(root.dir, id);
        seen.add(dir);
        const result = await this.inspectCached(id, dir, root.ownedBy);
        if (result) claimed.add(id);
        if (result && isUsable(result)) found.set(id, result);
      }
    }
    for (const dir of this.inspections.keys()) if (!seen.has(dir)) this.inspections.delete(dir);

    const added = [...found.keys()].filter((id) => !this.models.has(id));
    const removed = [...this.models.keys()].filter((id) => !found.has(id));
    if (added.length || removed.length) {
      logger.info({ added, removed, models: [...found.keys()] }, 'models changed');
      this.warnOfAliases(new Set(found.keys()));
    }
    this.models = found;
    this.scannedRoots = new Map(this.options.roots.map((root, i) => [root.dir, times[i]]));
  }

  /** Logs the aliases that answer nothing now that `installed` are the models: hidden by a model's id, or naming none. */
  private warnOfAliases(installed: ReadonlySet<string>): void {
    const { logger } = this.options;
    const dangling = new Map<string, string[]>();
    for (const [alias, target] of Object.entries(this.options.aliases)) {
      if (installed.has(alias) && target !== alias) {
        logger.warn({ alias, target }, `the alias '${alias}' is hidden by the installed model '${alias}', which requests for '${alias}' get: rename that model folder, or drop the alias`);
      } else if (!installed.has(target)) dangling.set(target, [...(dangling.get(target) ?? []), alias]);
    }
    // Aliases name installed models' ids, not other aliases: one line per missing target.
    const skipped = new Map(this.unusable().map((folder) => [folder.id, folder.reason]));
    for (const [target, aliases] of dangling) {
      const named = aliases.map((alias) => `'${alias}'`).join(', ');
      // A folder skipped for a fault: "not installed" sent its operator to install what is there, to be told it exists.
      const reason = skipped.get(target);
      const why = reason ? `which is installed but cannot be used (${reason})` : "which is not an installed model's id";
      const until = reason ? 'its folder is repaired' : 'such a model is installed';
      logger.warn({ aliases, target }, `the alias${aliases.length > 1 ? 'es' : ''} ${named} name${aliases.length > 1 ? '' : 's'} '${target}', ${why}: ${aliases.length > 1 ? 'they answer' : 'it answers'} nothing until ${until} (MODEL_ALIASES, DEFAULT_MODEL)`);
    }
  }

  /**
   * Inspects a folder again only when it changed since the last scan; unusable ones are logged then.
   * Undefined: not a folder, or removed while scanning.
   */
  private async inspectCached(id: string, dir: string, ownedBy: string): Promise<ModelEntry | UnusableModel | undefined> {
    let signature: string;
    let result: ModelEntry | UnusableModel;
    const before = this.inspections.get(dir)?.result;
    try {
      const folder = await folderSignature(dir);
      signature = folder.signature;
      const last = this.inspections.get(dir);
      if (last?.signature === signature) return last.result;
      result = await inspect(id, dir, ownedBy, folder.mtimeMs, versionOf(folder.weights));
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code ?? 'unreadable';
      // Removed while scanning: nothing to say.
      if (code === 'ENOENT' && !(await lstat(dir).catch(() => undefined))) {
        this.inspections.delete(dir);
        return undefined;
      }
      // A link to nothing, round in a circle or to a file: said once, with the reason `imagegen models list` gives.
      signature = `unreadable:${code}`;
      const last = this.inspections.get(dir);
      if (last?.signature === signature) return last.result;
      result = await inspect(id, dir, ownedBy, Date.now(), signature);
    }
    if (!isUsable(result)) this.options.logger.warn({ model: id, dir }, `skipping model: ${result.reason}`);
    else for (const note of notesOf(result)) this.options.logger.warn({ model: id, dir }, note);
    // A model served before and since: an operator who edited its imagegen.json (or replaced its files) is told the change was taken.
    if (isUsable(result) && before && isUsable(before)) {
      const what = result.version === before.version ? `its ${OVERRIDE_FILE} changed, and the next requests for it follow it` : 'its files changed, and the workers load it anew as they next run it';
      this.options.logger.info({ model: id, dir }, `model '${id}' read again: ${what}`);
    }
    this.inspections.set(dir, { id, signature, result });
    return result;
  }
}
