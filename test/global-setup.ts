import { execFile } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import type { TestProject } from 'vitest/node';
import { buildReferenceModels } from '../src/reference/index.js';
// onnxruntime's telemetry off for every process of the run, as the server and the CLI turn it off for theirs.
import '../src/runtime/telemetry-off.js';

declare module 'vitest' {
  export interface ProvidedContext {
    /** A folder holding one reference model per family, built once per test run. */
    referenceModelsDir: string;
  }
}

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  // Every temporary folder of the run (the tests', the servers' and CLIs' they start, the browser's)
  // goes in one that the run removes as it ends: a test that keeps its folder, or ends before it
  // removes it, leaves nothing behind in the machine's temporary folder.
  const root = await mkdtemp(path.join(os.tmpdir(), 'imagegen-test-'));
  process.env.TMPDIR = root;
  const dir = await mkdtemp(path.join(root, 'reference-'));
  await buildReferenceModels(dir);
  // The build (dist/), as `npm start` makes it, when a source changed since the last one: the servers
  // under test serve its playground bundle, and the processes tests start run its CLI (helpers/cli.ts).
  await promisify(execFile)(process.execPath, ['scripts/build-if-stale.mjs']);
  project.provide('referenceModelsDir', dir);
  return () => rm(root, { recursive: true, force: true });
}
