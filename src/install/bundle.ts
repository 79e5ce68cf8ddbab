import { open, stat, type FileHandle } from 'node:fs/promises';
import path from 'node:path';
import type { Disk, FileWriter } from './disk.js';
import { ModelInstallError } from './errors.js';

/**
 * Bundles: the single file `models export` writes to carry a model into an air-gapped site. A bundle is
 * a plain POSIX tar (uncompressed: ONNX weights barely compress, and a plain tar streams, lists with
 * `tar tf` and unpacks with `tar xf` into a folder that `models import` accepts as well). Entries are
 * `<id>/<file>`; pax headers carry paths over 100 bytes and files of 8 GiB or more. Only regular files
 * and folders are read back: links and device entries are refused. Tars of an export folder made by hand
 * are read too, in GNU tar's default format as well (its long names and base-256 sizes).
 */

const BLOCK = 512;
/** The largest size the 11 octal digits of a ustar header can hold. */
const USTAR_MAX_SIZE = 0o77777777777;
const READ_CHUNK = 1024 * 1024;

const padding = (size: number) => (BLOCK - (size % BLOCK)) % BLOCK;

function octal(value: number, width: number): string {
  return `${value.toString(8).padStart(width - 1, '0')}\0`;
}

function header(name: string, size: number, type: '0' | 'x', mtime: number): Buffer {
  const block = Buffer.alloc(BLOCK);
  block.write(name, 0, 100, 'utf8');
  block.write(octal(0o644, 8), 100, 'ascii');
  block.write(octal(0, 8), 108, 'ascii');
  block.write(octal(0, 8), 116, 'ascii');
  block.write(octal(Math.min(size, USTAR_MAX_SIZE), 12), 124, 'ascii');
  block.write(octal(mtime, 12), 136, 'ascii');
  block.write(type, 156, 'ascii');
  block.write('ustar\u000000', 257, 'ascii');
  block.write(`${octal(checksum(block), 7)} `, 148, 'ascii');
  return block;
}

/** Sum of the header's bytes, its checksum field counted as spaces. */
function checksum(block: Buffer): number {
  let sum = 0;
  for (let i = 0; i < BLOCK; i++) sum += i >= 148 && i < 156 ? 0x20 : block[i];
  return sum;
}

/** "<length> key=value\n", the length counting itself. */
function paxRecord(key: string, value: string): string {
  const body = ` ${key}=${value}\n`;
  let length = Buffer.byteLength(body) + 1;
  while (String(length).length + Buffer.byteLength(body) !== length) length++;
  return `${length}${body}`;
}

/** Writes a bundle through the disk seam, one file after the other. */
export class BundleWriter {
  private constructor(private readonly writer: FileWriter) {}

  static async create(file: string, disk: Disk): Promise<BundleWriter> {
    return new BundleWriter(await disk.openWriter(file, 'create'));
  }

  /** Adds a file of `size` bytes; `content` must yield exactly that many. */
  async add(name: string, size: number, content: AsyncIterable<Uint8Array> | Iterable<Uint8Array>): Promise<void> {
    const mtime = Math.floor(Date.now() / 1000);
    const nameBytes = Buffer.byteLength(name);
    if (nameBytes > 100 || size > USTAR_MAX_SIZE) {
      const pax = Buffer.from((nameBytes > 100 ? paxRecord('path', name) : '') + (size > USTAR_MAX_SIZE ? paxRecord('size', String(size)) : ''));
      await this.writer.write(header(`PaxHeaders/${path.posix.basename(name)}`.slice(0, 100), pax.length, 'x', mtime));
      await this.writer.write(Buffer.concat([pax, Buffer.alloc(padding(pax.length))]));
    }
    await this.writer.write(header(name.slice(0, 100), size, '0', mtime));
    let written = 0;
    for await (const chunk of content) {
      written += chunk.length;
      if (written > size) break;
      await this.writer.write(chunk);
    }
    if (written !== size) throw new ModelInstallError(`${name} changed size while it was being exported (${size} bytes expected); export again when nothing writes to the model`);
    await this.writer.write(Buffer.alloc(padding(size)));
  }

  /** Writes the end-of-archive marker (two empty blocks) and closes the file. */
  async finish(): Promise<void> {
    await this.writer.write(Buffer.alloc(2 * BLOCK));
    await this.writer.close();
  }

  /** Closes the file after a failure (the caller deletes it). */
  async abort(): Promise<void> {
    await this.writer.close().catch(() => undefined);
  }
}

export interface BundleEntry {
  /** Relative path, forward slashes, the bundle's top folder removed. */
  path: string;
  size: number;
  read(): AsyncIterable<Uint8Array>;
}

export interface OpenBundle {
  /** The folder all entries were in (the exported model's id), if they shared one. */
  topFolder?: string;
  entries: BundleEntry[];
  close(): Promise<void>;
}

function field(block: Buffer, start: number, length: number): string {
  const raw = block.subarray(start, start + length);
  const end = raw.indexOf(0);
  return raw.subarray(0, end < 0 ? length : end).toString('utf8');
}

/**
 * A numeric header field: octal digits, or, with the first byte's high bit set, a base-256 number, as GNU
 * tar's default format writes the size of a file of 8 GiB or more (an SDXL UNet's or FLUX's weights).
 */
function numberField(block: Buffer, start: number, length: number): number {
  if (!(block[start] & 0x80)) return Number.parseInt(field(block, start, length).trim() || '0', 8);
  let value = block[start] & 0x7f;
  for (let i = start + 1; i < start + length; i++) value = value * 256 + block[i];
  return value;
}

/**
 * Whether `head`, a file's first block (or all of a shorter file), begins as a tar does: a header whose
 * checksum holds, or the ustar magic of one damaged since. A truncated or damaged tar passes (and is said
 * to be such later); a file of another kind does not.
 */
function startsAsTar(head: Buffer): boolean {
  if (field(head, 257, 6) === 'ustar') return true;
  return head.length === BLOCK && Number.parseInt(field(head, 148, 8), 8) === checksum(head);
}

/** Files a bundle is often carried in but that are not a tar, by their first bytes (and names), with what to do instead. */
const PACKED: { magic: number[]; extensions: string[]; what: string; advice: string }[] = [
  { magic: [0x1f, 0x8b], extensions: ['gz', 'tgz'], what: 'gzip-compressed', advice: 'gunzip it and import the .tar, or unpack it with "tar xzf" and import the model\'s folder' },
  { magic: [0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00], extensions: ['xz'], what: 'xz-compressed', advice: 'unxz it and import the .tar, or unpack it with "tar xJf" and import the model\'s folder' },
  { magic: [0x28, 0xb5, 0x2f, 0xfd], extensions: ['zst'], what: 'zstd-compressed', advice: 'unzstd it and import the .tar, or unpack it with "tar --zstd -xf" and import the model\'s folder' },
  { magic: [0x42, 0x5a, 0x68], extensions: ['bz2'], what: 'bzip2-compressed', advice: 'bunzip2 it and import the .tar, or unpack it with "tar xjf" and import the model\'s folder' },
  { magic: [0x50, 0x4b, 0x03, 0x04], extensions: ['zip'], what: 'a zip archive', advice: "unzip it and import the model's folder" },
  { magic: [0x37, 0x7a, 0xbc, 0xaf, 0x27, 0x1c], extensions: ['7z'], what: 'a 7-Zip archive', advice: "unpack it (7z x) and import the model's folder" },
  { magic: [0x52, 0x61, 0x72, 0x21, 0x1a, 0x07], extensions: ['rar'], what: 'a RAR archive', advice: "unpack it (unrar x) and import the model's folder" },
];

/**
 * What `file`'s name says it is, where that is one of the PACKED kinds (`x.tar.gz`, `x.zip`): its
 * extension, and the name without it (and without a `.tar` before it).
 */
export function packedName(file: string): { extension: string; stem: string } | undefined {
  const match = /(?:\.tar)?\.([a-z0-9]+)$/i.exec(file);
  if (!match || !PACKED.some(({ extensions }) => extensions.includes(match[1].toLowerCase()))) return undefined;
  return { extension: match[1], stem: file.slice(0, match.index) };
}

function parsePax(data: Buffer): Record<string, string> {
  const records: Record<string, string> = {};
  let at = 0;
  while (at < data.length) {
    const space = data.indexOf(0x20, at);
    const length = Number(data.subarray(at, space).toString('ascii'));
    if (space < 0 || !Number.isInteger(length) || length <= 0) break;
    const record = data.subarray(space + 1, at + length - 1).toString('utf8');
    const eq = record.indexOf('=');
    records[record.slice(0, eq)] = record.slice(eq + 1);
    at += length;
  }
  return records;
}

/**
 * Why an entry that is not a regular file is refused, and how to make a tar that holds the file. Such a
 * tar is not damaged (copying it again brings the same links): `tar cf` of a Hugging Face cache snapshot,
 * a folder of links into its blob store, holds the links, and GNU tar stores a file linked twice as a
 * hard link to its first copy.
 */
function notAFile(file: string, name: string, type: string): ModelInstallError {
  const alternatives = `import the model's folder itself (its links are followed), or write the bundle with "imagegen models export"`;
  const why =
    type === '2'
      ? `as a symbolic link (tar type '2'), not as the file it leads to; make the tar again with "tar -h" (--dereference), which stores the files links lead to, or ${alternatives}`
      : type === '1'
        ? `as a hard link to another entry (tar type '1'), not as a file of its own; make the tar again with GNU tar's --hard-dereference, or ${alternatives}`
        : `as a special file (tar type '${type}'), not a regular file; ${alternatives}`;
  return new ModelInstallError(`${file} holds ${name} ${why}. A bundle holds regular files only.`);
}

/** A relative path that stays inside the folder it is unpacked into, or undefined. */
function safePath(name: string): string | undefined {
  const normal = path.posix.normalize(name.replace(/^(\.\/)+/, ''));
  if (!normal || normal === '.' || path.posix.isAbsolute(normal) || normal === '..' || normal.startsWith('../') || normal.includes('\\')) return undefined;
  return normal.replace(/\/+$/, '');
}

/**
 * Reads a bundle's table of contents (headers only: entries are read in place later, so the manifest
 * can be checked before any file is unpacked). Damaged or truncated bundles are refused here.
 */
export async function openBundle(file: string): Promise<OpenBundle> {
  const handle = await open(file, 'r');
  try {
    const fileSize = (await stat(file)).size;
    const all = await readEntries(handle, file, fileSize);
    // Dot-files beside the folder, which no install takes (model-files.ts), do not hide it: macOS's tar
    // adds `._<name>` (AppleDouble) for each file or folder with extended attributes (a downloaded
    // folder's quarantine flag), and Finder leaves `.DS_Store`.
    const entries = all.filter((entry) => !entry.path.startsWith('.'));
    const tops = new Set(entries.map((entry) => entry.path.split('/')[0]));
    const topFolder = tops.size === 1 && entries.every((entry) => entry.path.includes('/')) ? [...tops][0] : undefined;
    if (!topFolder) return { entries: all, close: () => handle.close() };
    for (const entry of entries) entry.path = entry.path.slice(topFolder.length + 1);
    return { topFolder, entries, close: () => handle.close() };
  } catch (err) {
    await handle.close();
    throw err;
  }
}

async function readEntries(handle: FileHandle, file: string, fileSize: number): Promise<BundleEntry[]> {
  const damaged = (what: string) =>
    new ModelInstallError(`${file} is not a readable bundle (${what}); it may be truncated or damaged: copy it again, or make it again with "imagegen models export"`);
  const readAt = async (position: number, length: number) => {
    if (position + length > fileSize) throw damaged(`it ends at byte ${fileSize}, inside an entry`);
    const buffer = Buffer.alloc(length);
    await handle.read(buffer, 0, length, position);
    return buffer;
  };

  // Said as what it is: "damaged, copy it again" would send the user to copy a good file again.
  const head = await readAt(0, Math.min(BLOCK, fileSize));
  const packed = PACKED.find(({ magic }) => magic.every((byte, i) => head[i] === byte));
  if (packed) throw new ModelInstallError(`${file} is ${packed.what}, not a bundle (an uncompressed tar): ${packed.advice}`);
  if (fileSize > 0 && !startsAsTar(head)) {
    // Most often one of a model's own files (model_index.json, a model.onnx) given for its folder.
    throw new ModelInstallError(
      `${file} is neither a model folder nor a bundle (a tar, as "imagegen models export" writes one): give the model's folder (the one that holds model_index.json and unet/ or transformer/) rather than a file in it, or a bundle`,
    );
  }

  const entries: BundleEntry[] = [];
  let pax: Record<string, string> = {};
  /** The name a GNU 'L' entry gives the entry after it. */
  let longName: string | undefined;
  for (let at = 0; ; ) {
    if (at + BLOCK > fileSize) throw damaged('it has no end-of-archive marker');
    const block = await readAt(at, BLOCK);
    if (block.every((byte) => byte === 0)) return entries;
    if (Number.parseInt(field(block, 148, 8), 8) !== checksum(block)) throw damaged(`bad header checksum at byte ${at}`);
    const type = String.fromCharCode(block[156]);
    const prefix = field(block, 257, 6) === 'ustar' ? field(block, 345, 155) : '';
    const name = pax.path ?? longName ?? (prefix ? `${prefix}/${field(block, 0, 100)}` : field(block, 0, 100));
    const size = pax.size !== undefined ? Number(pax.size) : numberField(block, 124, 12);
    if (!Number.isSafeInteger(size) || size < 0) throw damaged(`bad size for ${name}`);
    const dataAt = at + BLOCK;
    at = dataAt + size + padding(size);
    if (type === 'x') {
      pax = parsePax(await readAt(dataAt, size));
      continue;
    }
    if (type === 'L') {
      longName = field(await readAt(dataAt, size), 0, size);
      continue;
    }
    // GNU's long link target, before the link entry it belongs to, which is refused below by its own name.
    if (type === 'K') continue;
    pax = {};
    longName = undefined;
    if (type === 'g' || type === '5') continue; // global pax settings, folders: nothing to unpack
    if (type !== '0' && type !== '\0') throw notAFile(file, name, type);
    const rel = safePath(name);
    if (!rel) throw damaged(`entry '${name}' points outside the bundle's folder`);
    if (dataAt + size > fileSize) throw damaged(`it ends at byte ${fileSize}, inside ${rel}`);
    // tar lets a later copy win; which one the maker meant is anybody's guess.
    if (entries.some((entry) => entry.path === rel)) throw damaged(`${rel} is in it twice`);
    entries.push({ path: rel, size, read: () => readRange(handle, dataAt, size) });
  }
}

async function* readRange(handle: FileHandle, start: number, size: number): AsyncIterable<Uint8Array> {
  for (let done = 0; done < size; ) {
    const length = Math.min(READ_CHUNK, size - done);
    const buffer = Buffer.alloc(length);
    const { bytesRead } = await handle.read(buffer, 0, length, start + done);
    if (bytesRead === 0) throw new ModelInstallError(`the bundle ended early while reading it; copy it again`);
    done += bytesRead;
    yield buffer.subarray(0, bytesRead);
  }
}
