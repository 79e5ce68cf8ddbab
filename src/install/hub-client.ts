import path from 'node:path';
import { HubApiError, listFiles, modelInfo } from '@huggingface/hub';
import { DEFAULT_HUB_URL } from './constants.js';
import { ModelInstallError, ModelUsageError } from './errors.js';
import { parseUrl, withoutCredentials } from '../util/url.js';
import { firstLineOf, messageOf } from '../util/error-message.js';

/**
 * The Hugging Face Hub (or a mirror speaking its API): resolving a revision to a commit, listing a
 * commit's files with their checksums, and ranged downloads. Hub failures become messages that say
 * what to do.
 */

export interface RepoRef {
  /** owner/name */
  repo: string;
  /** Branch, tag or commit. */
  revision: string;
}

export interface HubFile {
  /** Relative to the subfolder pulled. */
  path: string;
  /** Relative to the repository root. */
  repoPath: string;
  size: number;
  /** Content sha256, for files stored in LFS (or Xet, which keeps the LFS ids). */
  sha256?: string;
  /** Git blob id, for small files stored in git itself. */
  gitBlobId?: string;
}

export interface HubClientOptions {
  hubUrl?: string;
  /** Sent as a bearer token (HF_TOKEN); needed for gated and private repositories. */
  token?: string;
  fetch?: typeof fetch;
  /** How long the Hub may leave a request unanswered, or a download without new bytes (default STALL_MS). */
  stallMs?: number;
  /** HF_HUB_OFFLINE's value: one that turns it on (hubOffline) asks for no Hub requests at all, a mirror's included, as Hugging Face's own tools do. */
  offline?: string;
}

/** Whether an HF_HUB_OFFLINE value turns offline mode on, read as huggingface_hub reads it (1, true, yes, on). */
function hubOffline(value: string | undefined): boolean {
  return /^(1|true|yes|on)$/i.test(value?.trim() ?? '');
}

/** How a model gets into a site the Hub cannot be reached from, once on a machine it can be. */
function carryIn(repo: string): string {
  // A model never installed anywhere has no bundle to export yet: the download itself can be carried in too.
  return `run "imagegen models pull ${repo}" then "imagegen models export <id> --out <file>" (or "huggingface-cli download ${repo} --local-dir <folder>"), carry the bundle or folder here and install it with "imagegen models import <bundle or folder>"`;
}

/**
 * A request the Hub has not answered, or a download that has sent nothing, for this long counts as a
 * lost connection (a download then resumes where it stopped): a server that accepts the connection and
 * says nothing must not hold a pull forever.
 */
const STALL_MS = 60_000;

/** The connection failed or dropped, or the server had a passing problem: worth trying again. */
export class ConnectionLost extends Error {}

/** A download response: its body starts at the offset asked for, or (`restarted`) at byte 0. */
export interface Download {
  body: AsyncIterable<Uint8Array>;
  restarted: boolean;
}

/** A file name's 255 bytes, less the `.part` its download is written to: a longer name could not be written. */
const MAX_NAME_BYTES = 255 - '.part'.length;

/** How many of a listing's refused paths its error names. */
const SHOWN_PATHS = 5;

const REPO_NAME = /^([\w.-]+\/)?[\w.-]+$/;

/** A repository's page as a browser shows it: `<hub>/owner/name`, or a folder of one revision, `.../tree/<revision>/<folder>`. */
const HUB_PAGE = /^(https?:\/\/[^/]+)\/([\w.-]+\/[\w.-]+)(?:\/(tree|blob|resolve)\/([^/]+)(?:\/(.*?))?)?\/?$/;

/** The command that pulls what the page at `text` shows, when it is one (HUB_PAGE): pasted from a browser, it is what the user meant. */
function pageCommand(text: string): string | undefined {
  const [, origin, repo, kind, revision = 'main', shown] = HUB_PAGE.exec(text) ?? [];
  if (!repo) return undefined;
  // A file's page (blob, resolve) shows one file of the folder to pull: its folder, none at the top.
  const folder = kind === 'tree' || !shown ? shown : path.posix.dirname(shown) === '.' ? undefined : path.posix.dirname(shown);
  const words = [`imagegen models pull ${repo}${revision === 'main' ? '' : `@${revision}`}`];
  if (folder) words.push(`--subfolder ${folder}`);
  if (origin !== DEFAULT_HUB_URL) words.push(`--hub-url ${origin}`);
  return words.join(' ');
}

/** "owner/name" or "owner/name@revision". */
export function parseRepoRef(text: string): RepoRef {
  const command = pageCommand(text);
  if (command) throw new ModelUsageError(`'${text}' is the address of a Hub page; pull takes the repository: ${command}`);
  const at = text.lastIndexOf('@');
  const repo = at < 0 ? text : text.slice(0, at);
  const revision = at < 0 ? 'main' : text.slice(at + 1);
  if (!REPO_NAME.test(repo) || !revision) {
    throw new ModelUsageError(`'${text}' is not a Hub repository: expected owner/name or owner/name@revision, e.g. stabilityai/sd-turbo`);
  }
  return { repo, revision };
}

/** The address a fetch call asks for, whichever form it was given in. */
function requestUrl(input: Parameters<typeof fetch>[0]): string {
  return typeof input === 'string' ? input : input instanceof URL ? input.href : input.url;
}

/** Why a fetch failed: undici's own message is "fetch failed"; the system's reason is in `cause`. */
function networkReason(err: unknown): string {
  const cause = err instanceof Error ? err.cause : undefined;
  return messageOf(cause ?? err);
}

export class HubClient {
  readonly hubUrl: string;
  private readonly fetch: typeof fetch;

  constructor(private readonly options: HubClientOptions = {}) {
    this.hubUrl = (options.hubUrl ?? DEFAULT_HUB_URL).replace(/\/+$/, '');
    // A value that is no address at all is the user's to fix (exit 2), not a Hub that answered wrongly.
    const parsed = parseUrl(this.hubUrl);
    if (!/^https?:$/.test(parsed?.protocol ?? '')) {
      throw new ModelUsageError(`'${withoutCredentials(this.hubUrl)}' is not an http(s) address of a Hub: set HF_ENDPOINT (--hub-url) to one such as ${DEFAULT_HUB_URL}, or unset it`);
    }
    // fetch refuses a URL with credentials, and every message naming the Hub would have shown the password.
    if (parsed?.username || parsed?.password) {
      throw new ModelUsageError(
        `'${withoutCredentials(this.hubUrl)}' holds a user:password, which is never sent: set HF_ENDPOINT (--hub-url) without it, and give the Hub's or mirror's token in HF_TOKEN (sent as Authorization: Bearer)`,
      );
    }
    const base = stallGuarded(options.fetch ?? fetch, options.stallMs ?? STALL_MS);
    const token = options.token;
    const hubOrigin = new URL(this.hubUrl).origin;
    // Our own header rather than the library's accessToken, which rejects tokens not starting with hf_
    // (mirrors issue their own). fetch drops it on redirects to another origin (the Hub's CDN); the
    // library also fetches the URLs the Hub's answers name (a listing's `Link: next` page), so the
    // token goes only to the Hub's own origin, never to a host an answer points to.
    this.fetch = token
      ? (input, init) => {
          if (parseUrl(requestUrl(input))?.origin !== hubOrigin) return base(input, init);
          const headers = new Headers(init?.headers);
          headers.set('Authorization', `Bearer ${token}`);
          return base(input, { ...init, headers });
        }
      : base;
  }

  /** The commit a revision points to now: pinning it keeps every file (and a resume) on one version. */
  async resolveCommit(ref: RepoRef): Promise<string> {
    if (hubOffline(this.options.offline)) {
      throw new ModelUsageError(`HF_HUB_OFFLINE is ${this.options.offline}, so pull asks nothing of the Hub or of a mirror (HF_ENDPOINT): unset it to pull ${ref.repo}, or, to install it here offline, on a machine with network access ${carryIn(ref.repo)}`);
    }
    try {
      const info = await modelInfo({ name: ref.repo, revision: ref.revision, hubUrl: this.hubUrl, fetch: this.fetch, additionalFields: ['sha'] });
      // A server that answers JSON without the commit is no Hub: downloading from resolve/undefined/ would follow.
      if (typeof info.sha !== 'string' || !/^[0-9a-f]{40}$/.test(info.sha)) throw new Error(`its model info for ${ref.repo} has no commit id (sha)`);
      return info.sha;
    } catch (err) {
      throw this.explain(err, ref);
    }
  }

  /**
   * Every file under `subfolder` (the whole repository when empty) at `commit`. A listing that names a
   * path outside it, or one that is not a plain relative path (`..`, empty or `.` parts, a backslash, a
   * name too long for a file), is refused whole: files are written where their paths say, under the model's folder.
   */
  async listFiles(ref: RepoRef, commit: string, subfolder = ''): Promise<HubFile[]> {
    const prefix = subfolder ? `${subfolder}/` : '';
    const files: HubFile[] = [];
    const strange: string[] = [];
    try {
      for await (const entry of listFiles({ repo: ref.repo, revision: commit, path: subfolder || undefined, recursive: true, hubUrl: this.hubUrl, fetch: this.fetch })) {
        if (entry.type !== 'file') continue;
        const parts = entry.path.startsWith(prefix) ? entry.path.slice(prefix.length).split('/') : [''];
        if (parts.some((part) => part === '' || part === '.' || part === '..' || /[\\\0]/.test(part) || Buffer.byteLength(part) > MAX_NAME_BYTES)) strange.push(entry.path);
        files.push({
          path: entry.path.slice(prefix.length),
          repoPath: entry.path,
          size: entry.lfs?.size ?? entry.size,
          sha256: entry.lfs?.oid,
          // For LFS files `oid` is the id of the pointer file, not of the content.
          gitBlobId: entry.lfs ? undefined : entry.oid,
        });
      }
    } catch (err) {
      if (subfolder && err instanceof HubApiError && err.statusCode === 404) {
        throw new ModelInstallError(`${ref.repo}@${ref.revision} has no folder '${subfolder}'; check --subfolder against the repository's files on the Hub`);
      }
      throw this.explain(err, ref);
    }
    if (strange.length > 0) {
      // A hostile listing may hold thousands: a few name the problem, the count says how big it is.
      const shown = strange.slice(0, SHOWN_PATHS).map((p) => JSON.stringify(p.length > 200 ? `${p.slice(0, 200)}…` : p));
      const more = strange.length > SHOWN_PATHS ? ` and ${strange.length - SHOWN_PATHS} more` : '';
      throw new ModelInstallError(`${this.hubUrl} listed ${shown.join(', ')}${more} in ${ref.repo}${subfolder ? ` under '${subfolder}'` : ''}: not a file path inside it (or a name too long for a file). Nothing was downloaded; a Hub or mirror that lists such paths is not to be pulled from`);
    }
    return files;
  }

  /** Downloads `repoPath` from byte `offset` (an HTTP Range request when resuming). */
  async download(ref: RepoRef, commit: string, repoPath: string, offset: number): Promise<Download> {
    const url = `${this.hubUrl}/${ref.repo}/resolve/${encodeURIComponent(commit)}/${repoPath.split('/').map(encodeURIComponent).join('/')}`;
    let response: Response;
    try {
      // identity: byte ranges must count the file's bytes, not those of a compressed rendering of it.
      response = await this.fetch(url, { headers: { 'Accept-Encoding': 'identity', ...(offset > 0 ? { Range: `bytes=${offset}-` } : {}) } });
    } catch (err) {
      throw new ConnectionLost(networkReason(err));
    }
    if (response.status >= 500 || response.status === 429) {
      await response.body?.cancel();
      throw new ConnectionLost(`the server answered ${response.status} ${response.statusText}`);
    }
    const resumed = response.status === 206 && response.headers.get('content-range')?.startsWith(`bytes ${offset}-`);
    if (!response.ok || !response.body || (response.status === 206 && !resumed)) {
      await response.body?.cancel();
      throw new ModelInstallError(`downloading ${repoPath} from ${this.hubUrl} failed: the server answered ${response.status} ${response.statusText}. Try again later, or check HF_ENDPOINT / --hub-url`);
    }
    return { body: guardBody(response.body), restarted: response.status === 200 };
  }

  private explain(err: unknown, ref: RepoRef): Error {
    if (err instanceof HubApiError) {
      const status = err.statusCode;
      const token = this.options.token;
      // The Hub's own words (the message also holds the URL, which names "revision" itself).
      const said = String(err.data?.error ?? '');
      if (status === 404 && /\brev(ision)?\b/i.test(said)) {
        return new ModelInstallError(`${ref.repo} has no revision '${ref.revision}'; check the branch, tag or commit after the @`);
      }
      if (status === 404) {
        return new ModelInstallError(`${ref.repo}: repository not found; check the name or set HF_TOKEN for gated/private repos (asked ${this.hubUrl})`);
      }
      if (status === 401 || status === 403) {
        return new ModelInstallError(
          token
            ? `${ref.repo}: access denied (${status}) with the HF_TOKEN given; accept the model's terms on its Hub page with the token's account, or use a token with read access`
            : `${ref.repo}: access denied (${status}): the repository is gated or private; accept its terms on the Hub and set HF_TOKEN to a read token`,
        );
      }
      return new ModelInstallError(`the Hub at ${this.hubUrl} answered ${status} for ${ref.repo}${said ? ` (${said})` : ''}; try again later`);
    }
    // fetch's own failure is a TypeError "fetch failed"; other TypeErrors come from answers of the wrong shape.
    if ((err instanceof TypeError && err.message === 'fetch failed') || err instanceof ConnectionLost) {
      return new ModelInstallError(
        `cannot reach the Hub at ${this.hubUrl} (${networkReason(err)}): check the network or proxy, or set HF_ENDPOINT (--hub-url) to a mirror. ` +
          `Without network access here, on a machine that has it ${carryIn(ref.repo)}`,
      );
    }
    // Anything else (a portal's HTML page where JSON should be) says the URL is not a Hub.
    return new ModelInstallError(`the server at ${this.hubUrl} did not answer as a Hugging Face Hub does (${firstLineOf(err)}); check HF_ENDPOINT / --hub-url`);
  }
}

/**
 * fetch that fails with ConnectionLost when the answer's headers, or the next bytes of its body, take
 * longer than `stallMs`. Not one timeout for the whole request: a large file may rightly take hours.
 */
function stallGuarded(base: typeof fetch, stallMs: number): typeof fetch {
  return async (input, init) => {
    const controller = new AbortController();
    const stalled = () => controller.abort(new ConnectionLost(`no answer from the server for ${stallMs / 1000} s`));
    let timer = setTimeout(stalled, stallMs);
    const response = await base(input, { ...init, signal: controller.signal }).finally(() => clearTimeout(timer));
    if (!response.body) return response;
    const reader = response.body.getReader();
    const body = new ReadableStream<Uint8Array>({
      async pull(stream) {
        timer = setTimeout(stalled, stallMs);
        try {
          const { done, value } = await reader.read();
          if (done) stream.close();
          else stream.enqueue(value);
        } finally {
          clearTimeout(timer);
        }
      },
      cancel: (reason) => reader.cancel(reason),
    });
    return new Response(body, { status: response.status, statusText: response.statusText, headers: response.headers });
  };
}

/** The body's read errors (a dropped connection) as ConnectionLost, so callers can tell them from disk errors. */
async function* guardBody(body: ReadableStream<Uint8Array>): AsyncIterable<Uint8Array> {
  try {
    for await (const chunk of body) yield chunk;
  } catch (err) {
    throw new ConnectionLost(networkReason(err));
  }
}
