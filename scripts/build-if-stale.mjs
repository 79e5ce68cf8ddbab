#!/usr/bin/env node
/**
 * `npm start`'s prestart: builds only when the build's inputs changed since the last successful build,
 * so that starting a built tree costs no compiler run (an incremental tsc still takes seconds to find
 * nothing changed). The inputs' fingerprint (every file's path, size and modification time) is taken
 * as a build begins (`--begin`) and kept as the stamp once it succeeded (`--stamp`): a file saved while
 * the build ran, or files copied in with their old times (rsync -a, tar, docker COPY), differ from it,
 * and so does a tree never built. Plain JavaScript: it runs before anything is built.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { npmRun } from './npm-run.mjs';

const STAMP = path.join('dist', '.build-stamp');
const BEGUN = path.join('dist', '.build-begun');
/** What the build reads: the sources, the playground's, and the files that configure them. */
const INPUTS = ['src', 'web', 'tsconfig.json', 'package.json', 'package-lock.json'];
/** What a start needs of the build: a tree whose output was deleted is built again. */
const ENTRY = path.join('dist', 'cli', 'main.js');

/** One line per file under `entry` (not following links): path, size, modification time. */
function fingerprint(entry, lines = []) {
  let stats;
  try {
    stats = lstatSync(entry);
  } catch {
    return lines;
  }
  if (stats.isDirectory()) for (const name of readdirSync(entry).sort()) fingerprint(path.join(entry, name), lines);
  else lines.push(`${entry} ${stats.size} ${stats.mtimeMs}`);
  return lines;
}

const current = () => INPUTS.flatMap((input) => fingerprint(input)).join('\n');

if (process.argv.includes('--begin')) {
  mkdirSync('dist', { recursive: true });
  writeFileSync(BEGUN, current());
} else if (process.argv.includes('--stamp')) {
  renameSync(BEGUN, STAMP);
} else {
  const stamped = existsSync(STAMP) ? readFileSync(STAMP, 'utf8') : undefined;
  if (stamped !== current() || !existsSync(ENTRY)) {
    const { command, args, shell } = npmRun('build');
    const build = spawnSync(command, args, { stdio: 'inherit', shell });
    if (build.error) console.error(`cannot run "npm run build": ${build.error.message}`);
    process.exit(build.status ?? 1);
  }
}
