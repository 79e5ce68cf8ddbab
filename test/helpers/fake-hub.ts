import { createHash } from 'node:crypto';
import { readdir, readFile, stat } from 'node:fs/promises';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';

/**
 * A Hugging Face Hub on 127.0.0.1 answering what @huggingface/hub and the downloader ask: model info
 * (`/api/models/<repo>/revision/<rev>`), the recursive file tree with LFS ids
 * (`/api/models/<repo>/tree/<rev>/<path>`), and `/<repo>/resolve/<rev>/<path>` downloads, which for
 * LFS files redirect to a "CDN" path as the real Hub does. Downloads honour Range requests. Faults can
 * be injected: a connection dropped mid-file, a file longer than listed, a wrong checksum in the listing,
 * an error status (a Hub rate-limiting or overloaded for a moment), a Range request answered whole.
 */

export interface FakeRepoOptions {
  /** When set, every API call and download must carry "Authorization: Bearer <token>". */
  token?: string;
}

export interface RecordedRequest {
  method: string;
  path: string;
  range?: string;
  authorization?: string;
}

interface FakeRepo extends FakeRepoOptions {
  commit: string;
  files: Map<string, Buffer>;
}

/** Files the real Hub keeps in LFS: weights by extension (its .gitattributes), and anything big. */
const isLfs = (file: string, data: Buffer) => /\.(onnx|onnx_data|pb|safetensors|bin)$/.test(file) || data.length >= 100 * 1024;

const sha256 = (data: Buffer) => createHash('sha256').update(data).digest('hex');
const gitBlobId = (data: Buffer) => createHash('sha1').update(`blob ${data.length}\0`).update(data).digest('hex');

/** Every file under `dir` by relative path (forward slashes). */
export async function readFolderFiles(dir: string): Promise<Record<string, Buffer>> {
  const files: Record<string, Buffer> = {};
  const visit = async (rel: string) => {
    for (const name of await readdir(path.join(dir, rel))) {
      const child = rel ? `${rel}/${name}` : name;
      if ((await stat(path.join(dir, child))).isDirectory()) await visit(child);
      else files[child] = await readFile(path.join(dir, child));
    }
  };
  await visit('');
  return files;
}

export class FakeHub {
  readonly requests: RecordedRequest[] = [];
  private readonly repos = new Map<string, FakeRepo>();
  /** "<repo>:<path>" -> bytes to send before dropping the connection, once. */
  private readonly drops = new Map<string, number>();
  private readonly wrongChecksums = new Set<string>();
  /** "<repo>:<path>" -> bytes sent after the file's own, once. */
  private readonly lengthened = new Map<string, number>();
  /** "<repo>:<path>" -> the status its next download is answered with instead of the file. */
  private readonly failures = new Map<string, number>();
  /** "<repo>:<path>" whose next download ignores its Range header. */
  private readonly rangeless = new Set<string>();

  private constructor(
    private readonly server: Server,
    readonly url: string,
  ) {}

  static async start(): Promise<FakeHub> {
    const server = createServer();
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const hub = new FakeHub(server, `http://127.0.0.1:${(server.address() as AddressInfo).port}`);
    server.on('request', (req, res) => hub.handle(req, res));
    return hub;
  }

  addRepo(name: string, files: Record<string, Buffer>, options: FakeRepoOptions = {}): void {
    const commit = createHash('sha1').update(name).digest('hex');
    this.repos.set(name, { ...options, commit, files: new Map(Object.entries(files)) });
  }

  commitOf(name: string): string {
    return this.repos.get(name)!.commit;
  }

  /** The next download of `file` sends `bytes` bytes, then the connection is destroyed. */
  dropOnce(repo: string, file: string, bytes: number): void {
    this.drops.set(`${repo}:${file}`, bytes);
  }

  /** The next download of `file` sends `bytes` more than the file holds (and its listing says), as a mirror whose copy changed since would. */
  lengthenOnce(repo: string, file: string, bytes: number): void {
    this.lengthened.set(`${repo}:${file}`, bytes);
  }

  /** The next download of `file` is answered `status` (429: rate-limited; 5xx: the Hub or its CDN failing for a moment). */
  failOnce(repo: string, file: string, status: number): void {
    this.failures.set(`${repo}:${file}`, status);
  }

  /** The next download of `file` sends the whole file (200), whatever Range it asked for, as a proxy that does not serve ranges does. */
  ignoreRangeOnce(repo: string, file: string): void {
    this.rangeless.add(`${repo}:${file}`);
  }

  /** The tree listing reports a wrong checksum (LFS sha256 or git blob id) for `file`. */
  reportWrongChecksum(repo: string, file: string): void {
    this.wrongChecksums.add(`${repo}:${file}`);
  }

  /** Requests for a file's content (resolve and CDN) of `repo`. */
  downloadsOf(repo: string, file: string): RecordedRequest[] {
    return this.requests.filter((r) => r.path.endsWith(`/${file}`) && (r.path.startsWith(`/${repo}/resolve/`) || r.path.startsWith(`/cdn/${repo}/`)));
  }

  close(): Promise<void> {
    this.server.closeAllConnections();
    return new Promise((resolve) => this.server.close(() => resolve()));
  }

  private handle(req: IncomingMessage, res: ServerResponse): void {
    const url = new URL(req.url!, this.url);
    const pathname = decodeURIComponent(url.pathname);
    this.requests.push({ method: req.method!, path: pathname, range: req.headers.range, authorization: req.headers.authorization });

    let match: RegExpExecArray | null;
    if ((match = /^\/api\/models\/(.+)\/revision\/([^/]+)$/.exec(pathname))) {
      const repo = this.authorised(req, res, match[1], match[2]);
      if (repo) this.json(res, 200, { _id: repo.commit.slice(0, 24), id: match[1], sha: repo.commit, private: false, gated: false, downloads: 0, likes: 0, lastModified: new Date(0).toISOString() });
    } else if ((match = /^\/api\/models\/(.+?)\/tree\/([^/]+)(?:\/(.*))?$/.exec(pathname))) {
      const repo = this.authorised(req, res, match[1], match[2]);
      if (repo) this.tree(res, match[1], repo, match[3] ?? '');
    } else if ((match = /^\/(.+?)\/resolve\/([^/]+)\/(.+)$/.exec(pathname))) {
      const repo = this.authorised(req, res, match[1], match[2]);
      if (!repo) return;
      const data = repo.files.get(match[3]);
      if (!data) return this.json(res, 404, { error: 'Entry not found' }, 'EntryNotFound');
      if (!isLfs(match[3], data)) return this.send(req, res, match[1], match[3], data);
      res.writeHead(302, { Location: `/cdn/${match[1]}/${repo.commit}/${match[3]}` }).end();
    } else if ((match = /^\/cdn\/(.+?)\/([0-9a-f]{40})\/(.+)$/.exec(pathname))) {
      const data = this.repos.get(match[1])?.files.get(match[3]);
      if (!data) return this.json(res, 404, { error: 'Not found' });
      this.send(req, res, match[1], match[3], data);
    } else {
      this.json(res, 404, { error: 'Not found' });
    }
  }

  /** The repository, or undefined once an error (unknown repo or revision, missing token) was sent. */
  private authorised(req: IncomingMessage, res: ServerResponse, name: string, revision: string): FakeRepo | undefined {
    const repo = this.repos.get(name);
    if (!repo) return this.json(res, 404, { error: 'Repository not found' }, 'RepoNotFound');
    if (repo.token && req.headers.authorization !== `Bearer ${repo.token}`) {
      return this.json(res, 401, { error: `Access to model ${name} is restricted. You must have access to it and be authenticated to access it. Please log in.` }, 'GatedRepo');
    }
    const rev = decodeURIComponent(revision);
    if (rev !== 'main' && rev !== 'HEAD' && rev !== repo.commit) return this.json(res, 404, { error: `Invalid rev id: ${rev}` }, 'RevisionNotFound');
    return repo;
  }

  private tree(res: ServerResponse, name: string, repo: FakeRepo, folder: string): void {
    const prefix = folder ? `${folder}/` : '';
    const paths = [...repo.files.keys()].filter((file) => file.startsWith(prefix));
    if (!paths.length) return void this.json(res, 404, { error: `Entry not found` }, 'EntryNotFound');
    const folders = new Set(paths.flatMap((file) => file.split('/').slice(0, -1).map((_, i, parts) => parts.slice(0, i + 1).join('/'))));
    const entries = [
      ...[...folders].filter((dir) => dir.startsWith(prefix)).map((dir) => ({ type: 'directory', oid: gitBlobId(Buffer.from(dir)), size: 0, path: dir })),
      ...paths.map((file) => {
        const data = repo.files.get(file)!;
        const wrong = this.wrongChecksums.has(`${name}:${file}`);
        const lie = (id: string) => (wrong ? `${id[0] === '0' ? '1' : '0'}${id.slice(1)}` : id);
        return isLfs(file, data)
          ? { type: 'file', oid: gitBlobId(Buffer.from(`pointer ${file}`)), size: data.length, path: file, lfs: { oid: lie(sha256(data)), size: data.length, pointerSize: 134 } }
          : { type: 'file', oid: lie(gitBlobId(data)), size: data.length, path: file };
      }),
    ];
    this.json(res, 200, entries);
  }

  private send(req: IncomingMessage, res: ServerResponse, repo: string, file: string, data: Buffer): void {
    const key = `${repo}:${file}`;
    const failure = this.failures.get(key);
    if (failure !== undefined) {
      this.failures.delete(key);
      return void this.json(res, failure, { error: 'try again later' });
    }
    const range = this.rangeless.delete(key) ? null : /^bytes=(\d+)-$/.exec(req.headers.range ?? '');
    const start = range ? Number(range[1]) : 0;
    if (start >= data.length && data.length > 0) {
      res.writeHead(416, { 'Content-Range': `bytes */${data.length}` }).end();
      return;
    }
    const extra = this.lengthened.get(key) ?? 0;
    this.lengthened.delete(key);
    const body = Buffer.concat([data.subarray(start), Buffer.alloc(extra)]);
    const headers = { 'Content-Length': body.length, 'Accept-Ranges': 'bytes', ETag: `"${sha256(data)}"` };
    if (range) res.writeHead(206, { ...headers, 'Content-Range': `bytes ${start}-${data.length - 1}/${data.length}` });
    else res.writeHead(200, headers);

    const drop = this.drops.get(key);
    if (drop === undefined) return void res.end(body);
    this.drops.delete(key);
    // A pause before the drop: the client's stream discards what it has not read yet when it errors.
    res.write(body.subarray(0, drop), () => setTimeout(() => res.socket?.destroy(), 100));
  }

  private json(res: ServerResponse, status: number, body: unknown, errorCode?: string): undefined {
    res.writeHead(status, { 'Content-Type': 'application/json', ...(errorCode ? { 'X-Error-Code': errorCode } : {}) }).end(JSON.stringify(body));
    return undefined;
  }
}
