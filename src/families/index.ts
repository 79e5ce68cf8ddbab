/**
 * The model-family registry: every family the server can run, one file each. Adding a family = its
 * own file exporting a FamilyEntry + one line in FAMILIES (docs/adding-a-model-family.md).
 */
import type { FamilyEntry, FolderFacts } from './family.js';
import { flux } from './flux.js';
import { sd } from './sd.js';
import { sdxl } from './sdxl.js';

export const FAMILIES: readonly FamilyEntry[] = [sd, sdxl, flux];

/** The folders a denoiser may be in, in the order they are probed. */
export const DENOISER_FOLDERS: readonly string[] = [...new Set(FAMILIES.map((family) => family.denoiserFolder))];

/**
 * The family a folder is, or undefined when none says it is. Only the families whose denoiser lives
 * where the folder's does are asked. Two that both say so would make the folder's family depend on
 * the order of FAMILIES: that is a mistake in their recognise(), named here.
 */
export function recogniseFamily(folder: FolderFacts): FamilyEntry | undefined {
  const matches = FAMILIES.filter((family) => family.denoiserFolder === folder.denoiserFolder && family.recognise(folder));
  if (matches.length > 1) {
    throw new Error(`the model families ${matches.map((f) => f.name).join(' and ')} all recognise this folder: their recognise() rules must exclude each other (src/families/)`);
  }
  return matches[0];
}

export function familyEntry(name: string): FamilyEntry {
  const family = FAMILIES.find((f) => f.name === name);
  if (!family) throw new Error(`unknown model family "${name}" (known: ${FAMILIES.map((f) => f.name).join(', ')})`);
  return family;
}
