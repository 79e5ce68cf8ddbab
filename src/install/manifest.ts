import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { z } from 'zod';
import { describeIssues, parseJson, readTextIfPresent } from '../util/files.js';
import { ModelInstallError } from './errors.js';
import { MANIFEST_FILE } from './constants.js';
import { OVERRIDE_FILE } from '../models/model-folder.js';
import { messageOf } from '../util/error-message.js';

/**
 * `imagegen-manifest.json`: the size and sha256 of every file of a model. Every install writes one into
 * the model folder, every export puts one into the bundle, and imports verify against it, so a model
 * carried into an air-gapped site is checked against the hashes the Hub published.
 */

const digestSchema = z.object({
  sha256: z.string().regex(/^[0-9a-f]{64}$/, 'expected 64 lowercase hex digits'),
  size: z.number().int().min(0),
});

const manifestSchema = z.object({
  files: z.record(z.string(), digestSchema),
  /** Where a pulled model came from; kept through export and import. */
  source: z
    .object({
      repo: z.string(),
      revision: z.string(),
      commit: z.string(),
      subfolder: z.string().optional(),
    })
    .optional(),
});

export type FileDigest = z.infer<typeof digestSchema>;
export type Manifest = z.infer<typeof manifestSchema>;

/**
 * Whether a manifest vouches for `file`: every file of the export but imagegen.json, the preset override
 * docs/api.md has the operator write and tune in the installed model's folder (its content is checked
 * wherever it is read, by the layout check). Held to the manifest written at install, a tuned preset
 * made the model's export, and the import of its folder copied elsewhere, refuse it, with nothing to do
 * but delete the manifest and lose the checksums of every weight.
 */
export const vouchedFor = (file: string) => file !== OVERRIDE_FILE;

/** Checks a manifest's text; `where` names it in the error. The files it gives are those it vouches for. */
export function parseManifest(text: string, where: string): Manifest {
  const whatToDo = 'copy the model again, or delete the manifest to import without checksums';
  let json: unknown;
  try {
    json = parseJson(text, where);
  } catch (err) {
    throw new ModelInstallError(`${messageOf(err)}; ${whatToDo}`);
  }
  const parsed = manifestSchema.safeParse(json);
  if (!parsed.success) throw new ModelInstallError(`${where} is not a valid manifest (${describeIssues(parsed.error)}); ${whatToDo}`);
  return { ...parsed.data, files: Object.fromEntries(Object.entries(parsed.data.files).filter(([file]) => vouchedFor(file))) };
}

/** The manifest in a model folder, or undefined when it has none. */
export async function readManifest(dir: string): Promise<Manifest | undefined> {
  const file = path.join(dir, MANIFEST_FILE);
  const text = await readTextIfPresent(file);
  return text === undefined ? undefined : parseManifest(text, file);
}

export function manifestText(manifest: Manifest): string {
  const files = Object.fromEntries(Object.entries(manifest.files).sort(([a], [b]) => (a < b ? -1 : 1)));
  return `${JSON.stringify({ ...manifest, files }, null, 2)}\n`;
}

export async function writeManifest(dir: string, manifest: Manifest): Promise<void> {
  await writeFile(path.join(dir, MANIFEST_FILE), manifestText(manifest));
}
