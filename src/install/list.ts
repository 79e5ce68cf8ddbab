import path from 'node:path';
import type { ModelLayout } from '../models/layout.js';
import { inspectModelFolder, notesOf } from '../models/model-folder.js';
import { modelFolderNames } from '../models/registry.js';
import { unlessMissing } from '../util/files.js';
import { listFolder } from './disk.js';
import { pullStagingPath, unfinishedPulls } from './installer.js';

/** `models list`: what the models folder holds, and whether the server can use each model. */

export interface ModelStatus {
  id: string;
  /** `partial`: a pull that stopped before finishing; running it again resumes it. */
  status: 'ok' | 'broken' | 'partial';
  family?: ModelLayout['family'];
  variant?: ModelLayout['variant'];
  /** Bytes of its files. */
  bytes: number;
  /** Why a model is broken or partial; for one that is ok, what it runs otherwise than its folder asks (models/model-folder.ts notesOf). */
  reason?: string;
}

async function folderBytes(dir: string): Promise<number> {
  return (await listFolder(dir).catch(() => [])).reduce((sum, file) => sum + file.size, 0);
}

/** Installed models by id (a folder the server skips is listed as broken, for the same reason), then unfinished pulls. */
export async function listModels(modelsDir: string): Promise<ModelStatus[]> {
  // A folder that is not there holds no models; one that cannot be read (another user's) is no empty one.
  const ids = (await unlessMissing(modelFolderNames(modelsDir))) ?? [];
  const models: ModelStatus[] = [];
  for (const id of ids) {
    const dir = path.join(modelsDir, id);
    const bytes = await folderBytes(dir);
    const verdict = await inspectModelFolder(dir);
    if (!verdict.usable) {
      models.push({ id, status: 'broken', bytes, reason: verdict.reason });
      continue;
    }
    const notes = notesOf(verdict);
    models.push({ id, status: 'ok', family: verdict.layout.family, variant: verdict.layout.variant, bytes, ...(notes.length > 0 && { reason: notes.join('; ') }) });
  }
  for (const id of (await unfinishedPulls(modelsDir)).sort()) {
    const bytes = await folderBytes(pullStagingPath(modelsDir, id));
    models.push({ id, status: 'partial', bytes, reason: `unfinished pull: run the same "imagegen models pull" again to resume it, or "imagegen models remove ${id}" to discard it` });
  }
  return models;
}
