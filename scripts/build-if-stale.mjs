#!/usr/bin/env node
/**
 * `npm start`'s prestart: builds only when a source changed since the last successful build, so that
 * starting a built tree costs no compiler run (an incremental tsc still takes seconds to find nothing
 * changed). `npm run build` ends by writing the stamp (`--stamp`); a missing stamp, or any file of the
 * build's inputs newer than it, runs `npm run build`. Plain JavaScript: it runs before anything is built.
 */
import { spawnSync } from 'node:child_process';
import { readdirSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';

const STAMP = path.join('dist', '.build-stamp');
/** What the build reads: the sources, the playground's, and the files that configure them. */
const INPUTS = ['src', 'web', 'tsconfig.json', 'package.json'];

/** The newest modification time under `entry` (a file or a folder), in ms; 0 when it does not exist. */
function newest(entry) {
  let stats;
  try {
    stats = statSync(entry);
  } catch {
    return 0;
  }
  if (!stats.isDirectory()) return stats.mtimeMs;
  return readdirSync(entry).reduce((latest, name) => Math.max(latest, newest(path.join(entry, name))), stats.mtimeMs);
}

if (process.argv.includes('--stamp')) {
  writeFileSync(STAMP, `${new Date().toISOString()}\n`);
} else {
  let stamped = 0;
  try {
    stamped = statSync(STAMP).mtimeMs;
  } catch {
    // never built here
  }
  if (Math.max(...INPUTS.map(newest)) >= stamped) {
    const build = spawnSync('npm', ['run', 'build'], { stdio: 'inherit' });
    process.exit(build.status ?? 1);
  }
}
