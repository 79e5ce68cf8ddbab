import { mkdir, stat } from 'node:fs/promises';
import path from 'node:path';
import { openBundle, type BundleEntry } from './bundle.js';
import { diskFullError, ensureFreeSpace, listFolder, readChunks, realDisk, writeStream } from './disk.js';
import { ModelInstallError } from './errors.js';
import { isDiskFull, makeFolder } from '../util/files.js';
import {
  checkLayout,
  checkModelId,
  installStaged,
  makeTemporary,
  refuseExisting,
  removeTemporary,
  validateModel,
  type CommandOptions,
  type InstalledModel,
} from './installer.js';
import { parseManifest, readManifest, writeManifest, type FileDigest, type Manifest } from './manifest.js';
import { MANIFEST_FILE } from './constants.js';
import { checkHasExport, modelFilesOf, skippedNote } from './model-files.js';
import { Progress } from '../util/progress.js';
import { shellWord } from '../util/shell-word.js';
import { checkCoverage, FileHasher, hashing, verifiedDigest } from './verifier.js';

/**
 * `models import`: installs a model folder, or a bundle from `models export`, from local disk (the
 * air-gapped path). Files are verified against the source's manifest while they are copied.
 */

export interface ImportOptions extends CommandOptions {
  /** A model folder or a bundle file. */
  source: string;
  /** Model id; by default the folder's name or the bundle's top folder. */
  name?: string;
  force?: boolean;
  /** Load the ONNX sessions before installing (default true). */
  load?: boolean;
}

/** A model's files wherever they are: a folder, or a bundle read in place. */
interface Source {
  defaultId: string;
  manifest?: Manifest;
  files: BundleEntry[];
  skipped: string[];
  /** Export roots deeper in it are picked by importing that folder; a bundle is one export or none. */
  isFolder: boolean;
  close(): Promise<void>;
}

async function openFolder(dir: string): Promise<Source> {
  const { files, skipped } = modelFilesOf(await listFolder(dir));
  return {
    defaultId: path.basename(path.resolve(dir)),
    manifest: await readManifest(dir),
    files: files.map((file) => ({ ...file, read: () => readChunks(path.join(dir, file.path)) })),
    skipped,
    isFolder: true,
    close: async () => undefined,
  };
}

async function openBundleFile(file: string): Promise<Source> {
  const bundle = await openBundle(file);
  try {
    const manifestEntry = bundle.entries.find((entry) => entry.path === MANIFEST_FILE);
    const chunks: Uint8Array[] = [];
    if (manifestEntry) for await (const chunk of manifestEntry.read()) chunks.push(chunk);
    const { files, skipped } = modelFilesOf(bundle.entries);
    return {
      defaultId: bundle.topFolder ?? path.basename(file).replace(/\.tar$/i, ''),
      manifest: manifestEntry ? parseManifest(Buffer.concat(chunks).toString('utf8'), `${file}: ${MANIFEST_FILE}`) : undefined,
      files,
      skipped,
      isFolder: false,
      close: bundle.close,
    };
  } catch (err) {
    await bundle.close();
    throw err;
  }
}

async function openSource(source: string): Promise<Source> {
  const info = await stat(source).catch(() => undefined);
  if (!info) throw new ModelInstallError(`${source} does not exist; give the path of a model folder, or of a bundle written by "imagegen models export"`);
  return info.isDirectory() ? openFolder(source) : openBundleFile(source);
}

export async function importModel(options: ImportOptions): Promise<InstalledModel> {
  const { modelsDir, disk = realDisk, output = process.stderr } = options;
  const source = await openSource(options.source);
  try {
    // Before the id and whether it is taken: a folder of exports is named as the user likes ("My exports"), or as a model
    // installed before, and what to give instead is the export's folder, not --name or --force.
    checkHasExport(
      {
        where: options.source,
        pick: (root) => (source.isFolder ? `imagegen models import ${shellWord(path.join(options.source, root))}` : `'${root}/' (unpack the bundle and import that folder)`),
        otherwise: source.isFolder
          ? 'give the export\'s own folder (it holds model_index.json and unet/ or transformer/); a model with only PyTorch weights must first be exported where they are, with "optimum-cli export onnx" (README, "Which real models")'
          : 'it is not a model bundle: write one with "imagegen models export"',
      },
      source.files.map((file) => file.path),
      [...source.files.map((file) => file.path), ...source.skipped],
    );
    const id = options.name ?? source.defaultId;
    checkModelId(id, 'choose one with --name');
    await refuseExisting(modelsDir, id, options.force ?? false);
    const recopy = 'Nothing was installed: copy the model again from a good source (or delete its imagegen-manifest.json if that is known to be stale)';
    if (source.manifest) checkCoverage(source.manifest, source.files.map((file) => file.path), options.source, recopy);
    // Once: a damaged file's reason says to copy it again from the export, and a missing tokenizer is not damaged.
    const unusable = { advice: 'Nothing was installed. Copy the complete export folder again', adviceAfterRemedy: 'Nothing was installed' };
    if (source.isFolder) await checkLayout(options.source, { label: options.source, ...unusable });
    if (source.skipped.length) output.write(skippedNote(options.source, source.skipped));

    const total = source.files.reduce((sum, file) => sum + file.size, 0);
    const spaceAdvice = 'Free up space, or use a --models-dir on a bigger disk, then import again';
    await makeFolder(modelsDir);
    await ensureFreeSpace(disk, modelsDir, total, spaceAdvice);
    const staging = await makeTemporary(modelsDir, `import-${id}`);
    try {
      const digests = await copyVerified(source, staging, { disk, output, total, manifest: source.manifest, advice: `It differs from the manifest of ${options.source}. ${recopy}` });
      await writeManifest(staging, { files: digests, source: source.manifest?.source });
      const layout = await validateModel(staging, {
        load: options.load ?? true,
        label: options.source,
        output,
        ...unusable,
      });
      const dir = await installStaged(staging, modelsDir, id, options.force ?? false);
      await removeTemporary(staging); // nothing left to remove; forgets it for the exit hook
      return { id, dir, family: layout.family, variant: layout.variant, bytes: total };
    } catch (err) {
      await removeTemporary(staging);
      throw isDiskFull(err) ? await diskFullError(disk, modelsDir, total, spaceAdvice) : err;
    }
  } finally {
    await source.close();
  }
}

/** Copies every file into `dir`, checking each against the manifest as soon as it is written. */
async function copyVerified(
  source: Source,
  dir: string,
  options: Required<Pick<ImportOptions, 'disk' | 'output'>> & { total: number; manifest?: Manifest; advice: string },
): Promise<Record<string, FileDigest>> {
  const progress = new Progress(options.output, 'copying', options.total);
  const digests: Record<string, FileDigest> = {};
  for (const file of source.files) {
    progress.startFile(file.path);
    const dest = path.join(dir, file.path);
    await mkdir(path.dirname(dest), { recursive: true });
    const hasher = new FileHasher();
    await writeStream(options.disk, dest, progress.counting(hashing(file.read(), hasher)));
    digests[file.path] = verifiedDigest(file.path, hasher, options.manifest?.files[file.path], options.advice);
    progress.fileDone();
  }
  progress.finish();
  return digests;
}
