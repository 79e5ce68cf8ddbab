import { fileURLToPath } from 'node:url';

/**
 * The built `imagegen` command (dist/cli/main.js), as `npm start` and users run it. test/global-setup.ts
 * builds it before any test when a source changed since the last build; the processes tests start
 * (the CLI, a server and its workers) then load compiled JavaScript, where under tsx each would
 * compile every module again (a second of a core per process).
 */
export const PROJECT_ROOT = fileURLToPath(new URL('../..', import.meta.url));
export const IMAGEGEN = fileURLToPath(new URL('../../dist/cli/main.js', import.meta.url));

/** node's arguments to run `imagegen ...args`. */
export const imagegenArgs = (...args: string[]): string[] => [IMAGEGEN, ...args];
