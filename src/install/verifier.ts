import { createHash, type Hash } from 'node:crypto';
import { ModelInstallError } from './errors.js';
import { vouchedFor, type FileDigest, type Manifest } from './manifest.js';
import { printable } from '../util/printable.js';

/**
 * Checks that files are what their source says they are: sizes, sha256 (the Hub's LFS ids and our
 * manifests) and git blob ids (the Hub's id for small files kept in git itself).
 */

export interface ExpectedFile {
  size: number;
  sha256?: string;
  /** sha1 of "blob <size>\0" + content. */
  gitBlobId?: string;
}

/** Hashes a file's bytes as they stream past, so nothing is read twice. */
export class FileHasher {
  private readonly sha256 = createHash('sha256');
  private readonly gitBlob: Hash | undefined;
  size = 0;

  /** `gitBlobSize`: also compute the git blob id, whose header needs the size up front. */
  constructor(gitBlobSize?: number) {
    this.gitBlob = gitBlobSize === undefined ? undefined : createHash('sha1').update(`blob ${gitBlobSize}\0`);
  }

  update(chunk: Uint8Array): void {
    this.sha256.update(chunk);
    this.gitBlob?.update(chunk);
    this.size += chunk.length;
  }

  digest(): FileDigest & { gitBlobId?: string } {
    return { sha256: this.sha256.digest('hex'), size: this.size, gitBlobId: this.gitBlob?.digest('hex') };
  }
}

/** Passes `source` through, feeding every chunk to `hasher`. */
export async function* hashing(source: AsyncIterable<Uint8Array>, hasher: FileHasher): AsyncIterable<Uint8Array> {
  for await (const chunk of source) {
    hasher.update(chunk);
    yield chunk;
  }
}

/**
 * The digest of a file `hasher` has read, for the manifest. Throws when it differs from `expected`
 * (when there is one); `advice` says what to do about it (it depends on where the file came from).
 * The error names `file` printable: a pulled repository, or a copied model, names its files.
 */
export function verifiedDigest(file: string, hasher: FileHasher, expected: ExpectedFile | undefined, advice: string): FileDigest {
  const actual = hasher.digest();
  if (expected) checkDigest(file, actual, expected, advice);
  return { sha256: actual.sha256, size: actual.size };
}

function checkDigest(file: string, actual: ReturnType<FileHasher['digest']>, expected: ExpectedFile, advice: string): void {
  const mismatch =
    actual.size !== expected.size
      ? `it has ${actual.size} bytes instead of ${expected.size}`
      : expected.sha256 && actual.sha256 !== expected.sha256
        ? `its sha256 is ${actual.sha256}, expected ${expected.sha256}`
        : expected.gitBlobId && actual.gitBlobId !== expected.gitBlobId
          ? `its git blob id is ${actual.gitBlobId}, expected ${expected.gitBlobId}`
          : undefined;
  if (mismatch) throw new ModelInstallError(`${printable(file)} failed verification: ${mismatch}. ${advice}`);
}

/**
 * Throws when files listed in `manifest` are missing from `paths`, or (unless `allowExtra`) when
 * `paths` holds files the manifest should vouch for and does not (see vouchedFor).
 */
export function checkCoverage(manifest: Manifest, paths: string[], where: string, advice: string, allowExtra = false): void {
  const present = new Set(paths);
  const missing = Object.keys(manifest.files).filter((file) => !present.has(file));
  const extra = allowExtra ? [] : paths.filter((file) => vouchedFor(file) && !Object.hasOwn(manifest.files, file));
  const problems = [
    ...(missing.length ? [`missing ${missing.join(', ')}`] : []),
    ...(extra.length ? [`not listed in the manifest: ${extra.join(', ')}`] : []),
  ];
  if (problems.length) throw new ModelInstallError(`${where} does not match its imagegen-manifest.json (${problems.join('; ')}). ${advice}`);
}
