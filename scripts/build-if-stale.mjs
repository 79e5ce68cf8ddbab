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

const readJson = (file) => {
  try {
    return JSON.parse(readFileSync(file, 'utf8'));
  } catch {
    return undefined;
  }
};

/**
 * The package's own dependencies that node_modules holds at another version than package-lock.json names,
 * or not at all: a checkout updated with `git pull` and started without `npm ci`. Built so, the tree
 * failed with a page of TypeScript errors (each module the new version added "cannot be found") and not
 * a word of what to do, or, where it compiled, ran on other dependencies than the ones it is tested with.
 */
function dependenciesOutOfDate() {
  const lock = readJson('package-lock.json');
  const pkg = readJson('package.json');
  if (!lock || !pkg) return [];
  return Object.keys({ ...pkg.dependencies, ...pkg.devDependencies }).flatMap((name) => {
    const locked = lock.packages?.[`node_modules/${name}`]?.version;
    const installed = readJson(path.join('node_modules', name, 'package.json'))?.version;
    return locked === undefined || installed === locked ? [] : [`${name}: ${installed ?? "not installed"}, locked ${locked}`];
  });
}

if (process.argv.includes('--begin')) {
  const outOfDate = dependenciesOutOfDate();
  if (outOfDate.length) {
    const shown = outOfDate.slice(0, 5).join('; ') + (outOfDate.length > 5 ? `; and ${outOfDate.length - 5} more` : '');
    console.error(`node_modules does not hold the dependencies package-lock.json names (${shown}): after updating the checkout (git pull), run "npm ci", then build or start again`);
    process.exit(1);
  }
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
