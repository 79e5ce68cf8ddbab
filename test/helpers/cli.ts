import { fileURLToPath } from 'node:url';
import { createEnginePool, type EnginePoolOptions } from '../../src/engine/pool.js';

/**
 * The built `imagegen` command (dist/cli/main.js), as `npm start` and users run it, and its worker
 * module. test/global-setup.ts builds them before any test when a source changed since the last build;
 * the processes tests start (the CLI, a server and its workers, the workers of a server or pool the
 * test runs in its own process) then load compiled JavaScript, where under tsx each would compile every
 * module again (a second of a core per process).
 */
export const PROJECT_ROOT = fileURLToPath(new URL('../..', import.meta.url));
const IMAGEGEN = fileURLToPath(new URL('../../dist/cli/main.js', import.meta.url));

/** The built worker module, for the worker pools tests start in their own process (EnginePoolOptions.workerScript). */
export const WORKER_SCRIPT = fileURLToPath(new URL('../../dist/engine/worker.js', import.meta.url));

/** node's arguments to run `imagegen ...args`. */
export const imagegenArgs = (...args: string[]): string[] => [IMAGEGEN, ...args];

/** A worker pool in this process whose workers run the built worker module. */
export const createBuiltPool = (options: EnginePoolOptions) => createEnginePool({ ...options, workerScript: WORKER_SCRIPT });
