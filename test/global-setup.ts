import { execFile } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import type { TestProject } from 'vitest/node';
import { buildReferenceModels } from '../src/reference/index.js';

declare module 'vitest' {
  export interface ProvidedContext {
    /** A folder holding one reference model per family, built once per test run. */
    referenceModelsDir: string;
  }
}

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-reference-'));
  await buildReferenceModels(dir);
  // The playground's bundle (dist/playground/), as `npm run build` makes it: the servers under test serve it.
  await promisify(execFile)('npm', ['run', '--silent', 'build:playground']);
  project.provide('referenceModelsDir', dir);
  return () => rm(dir, { recursive: true, force: true });
}
