import { cp, mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { inject, onTestFinished } from 'vitest';

/** The folder of one reference model family, built by the global setup. */
export function referenceModel(family: string): string {
  return path.join(inject('referenceModelsDir'), family);
}

/** A copy of a reference model that the running test may damage; deleted when the test ends. */
export async function copyOfReference(family: string): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), `imagegen-${family}-`));
  onTestFinished(() => rm(dir, { recursive: true, force: true }));
  await cp(referenceModel(family), dir, { recursive: true });
  return dir;
}
