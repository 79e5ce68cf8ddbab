import { rename, rm, stat } from 'node:fs/promises';
import path from 'node:path';
import { BundleWriter, packedName } from './bundle.js';
import { diskFullError, ensureFreeSpace, keepAfterExit, listFolder, readChunks, realDisk, removeIfInterrupted } from './disk.js';
import { ModelInstallError } from './errors.js';
import { exists, isDiskFull } from '../util/files.js';
import { checkInstalledId, modelPath, validateModel, type CommandOptions } from './installer.js';
import { manifestText, readManifest, type Manifest } from './manifest.js';
import { MANIFEST_FILE } from './constants.js';
import { modelFilesOf } from './model-files.js';
import { Progress } from '../util/progress.js';
import { checkCoverage, FileHasher, hashing, verifiedDigest } from './verifier.js';

/**
 * `models export`: writes an installed model as a bundle (see bundle.ts) to carry into an air-gapped
 * site. The files are checked against the manifest recorded when the model was installed, so a model
 * damaged on this disk is not carried elsewhere.
 */

export interface ExportOptions extends CommandOptions {
  id: string;
  /** The bundle file to write, or an existing folder to write `<id>.tar` into. */
  out: string;
}

export interface ExportedBundle {
  file: string;
  bytes: number;
}

/** Tar headers and padding: at most two blocks per file, plus the end marker. */
const overhead = (files: number) => (files + 1) * 2 * 512 + 1024;

export async function exportModel(options: ExportOptions): Promise<ExportedBundle> {
  const { modelsDir, id, disk = realDisk, output = process.stderr } = options;
  checkInstalledId(id);
  const dir = modelPath(modelsDir, id);
  if (!(await exists(dir))) throw new ModelInstallError(`there is no model '${id}' in ${modelsDir}; "imagegen models list" shows the installed ones`);
  const repair = `Pull or import '${id}' again before exporting it`;
  await validateModel(dir, { load: false, label: dir, advice: repair, undone: 'Nothing was exported' });
  const recorded = await readManifest(dir);
  const { files } = modelFilesOf(await listFolder(dir));
  const changed = `${repair}, or, if its files were changed on purpose, delete ${path.join(dir, MANIFEST_FILE)} to export it as it is now`;
  // Files added since the install (an imagegen.json preset override, say) are fine; missing ones are not.
  if (recorded) checkCoverage(recorded, files.map((file) => file.path), dir, changed, true);

  const isFolder = (await stat(options.out).catch(() => undefined))?.isDirectory() ?? false;
  // A trailing separator means a folder, as with cp: not a file named by the folder.
  if (!isFolder && /[\\/]$/.test(options.out)) throw new ModelInstallError(`the folder ${options.out} does not exist; create it, or give the bundle file's name as --out`);
  const file = isFolder ? path.join(options.out, `${id}.tar`) : options.out;
  // A name that says compressed or another archive would hold a plain tar all the same, which `tar xzf` and unzip refuse.
  const packed = packedName(file);
  if (packed) {
    throw new ModelInstallError(
      `${file} is named as a ${packed.extension} file, but a bundle is an uncompressed tar (which import reads where it is, without unpacking it first): name it ${packed.stem}.tar, and compress a copy to carry it if you like`,
    );
  }
  if (await exists(file)) throw new ModelInstallError(`${file} already exists; choose another --out, or delete it first`);
  if (!(await exists(path.dirname(path.resolve(file))))) throw new ModelInstallError(`the folder of ${file} does not exist; create it or choose another --out`);
  const total = files.reduce((sum, entry) => sum + entry.size, 0);
  const spaceAdvice = 'Free up space or choose an --out on another disk, then export again';
  await ensureFreeSpace(disk, path.dirname(path.resolve(file)), total + overhead(files.length), spaceAdvice);

  // Written under another name and renamed when complete: a bundle that exists is a whole one.
  const partial = `${file}.partial`;
  removeIfInterrupted(partial);
  const bundle = await BundleWriter.create(partial, disk);
  try {
    const progress = new Progress(output, 'exporting', total);
    const manifest: Manifest = { files: {}, source: recorded?.source };
    for (const entry of files) {
      progress.startFile(entry.path);
      const hasher = new FileHasher();
      await bundle.add(`${id}/${entry.path}`, entry.size, progress.counting(hashing(readChunks(path.join(dir, entry.path)), hasher)));
      manifest.files[entry.path] = verifiedDigest(`${id}/${entry.path}`, hasher, recorded?.files[entry.path], `It changed since the model was installed. ${changed}`);
      progress.fileDone();
    }
    const text = Buffer.from(manifestText(manifest));
    await bundle.add(`${id}/${MANIFEST_FILE}`, text.length, [text]);
    await bundle.finish();
    await rename(partial, file);
    progress.finish();
  } catch (err) {
    await bundle.abort();
    await rm(partial, { force: true });
    throw isDiskFull(err) ? await diskFullError(disk, path.dirname(path.resolve(file)), total, spaceAdvice) : err;
  } finally {
    keepAfterExit(partial);
  }
  return { file, bytes: (await stat(file)).size };
}
