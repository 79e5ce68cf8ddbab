import { execFile } from 'node:child_process';
import { mkdir, mkdtemp, readFile, rm, utimes, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';

/**
 * `npm start`'s prestart (scripts/build-if-stale.mjs) in a project of its own whose "build" only counts
 * its runs: a built tree starts without building, a changed source builds again, and a build that
 * failed leaves the tree to be built next time.
 */

const SCRIPT = path.resolve(import.meta.dirname, '../scripts/build-if-stale.mjs');
const run = promisify(execFile);

let root: string;
beforeEach(async () => {
  root = await mkdtemp(path.join(os.tmpdir(), 'imagegen-stale-'));
  await mkdir(path.join(root, 'src', 'http'), { recursive: true });
  await mkdir(path.join(root, 'dist'));
  await writeFile(path.join(root, 'src', 'http', 'app.ts'), 'export {};\n');
  await writeFile(path.join(root, 'tsconfig.json'), '{}\n');
  await writeFile(path.join(root, 'fail'), 'no');
  // The build appends a line to `builds`, fails while `fail` says yes, writes the entry point, and
  // fingerprints and stamps as npm run build does.
  const work = "const fs = require('fs'); fs.appendFileSync('builds', 'x\\\\n'); if (fs.readFileSync('fail', 'utf8') === 'yes') process.exit(3); fs.mkdirSync('dist/cli', { recursive: true }); fs.writeFileSync('dist/cli/main.js', '')";
  const build = `node ${JSON.stringify(SCRIPT)} --begin && node -e "${work}" && node ${JSON.stringify(SCRIPT)} --stamp`;
  await writeFile(path.join(root, 'package.json'), JSON.stringify({ name: 'stale-test', private: true, scripts: { build } }));
});
afterEach(() => rm(root, { recursive: true, force: true }));

const prestart = () => run(process.execPath, [SCRIPT], { cwd: root });
const builds = async () => (await readFile(path.join(root, 'builds'), 'utf8').catch(() => '')).split('\n').filter(Boolean).length;
/** Sets a file's modification time `seconds` from now. */
const touch = (file: string, seconds: number) => utimes(path.join(root, file), new Date(), new Date(Date.now() + seconds * 1000));

describe('build-if-stale (prestart)', () => {
  it('builds a tree never built, then starts a built one without building, and builds again when a source changed', async () => {
    await prestart();
    expect(await builds()).toBe(1);
    await prestart();
    await prestart();
    expect(await builds()).toBe(1);
    await touch('src/http/app.ts', 5);
    await prestart();
    expect(await builds()).toBe(2);
    await touch('tsconfig.json', 10);
    await prestart();
    expect(await builds()).toBe(3);
    // A source copied in with an older time (rsync -a, tar, docker COPY) is a change too.
    await touch('src/http/app.ts', -3600);
    await prestart();
    expect(await builds()).toBe(4);
    // So is a new file, and a build output deleted.
    await writeFile(path.join(root, 'src', 'new.ts'), 'export {};\n');
    await prestart();
    expect(await builds()).toBe(5);
    await rm(path.join(root, 'dist', 'cli', 'main.js'));
    await prestart();
    expect(await builds()).toBe(6);
    await prestart();
    expect(await builds()).toBe(6);
  });

  it('fails as the build fails, and builds again next time rather than starting what it left', async () => {
    await writeFile(path.join(root, 'fail'), 'yes');
    await expect(prestart()).rejects.toMatchObject({ code: 3 });
    await writeFile(path.join(root, 'fail'), 'no');
    await prestart();
    expect(await builds()).toBe(2);
    await prestart();
    expect(await builds()).toBe(2);
  });

  it('refuses to build with dependencies other than package-lock.json names (a git pull without npm ci), saying to run npm ci', async () => {
    const pkg = JSON.parse(await readFile(path.join(root, 'package.json'), 'utf8'));
    await writeFile(path.join(root, 'package.json'), JSON.stringify({ ...pkg, dependencies: { kept: '^1.0.0', added: '^2.0.0' }, devDependencies: { bumped: '^9.0.0' } }));
    const locked = { kept: '1.0.3', added: '2.1.0', bumped: '9.0.1' };
    await writeFile(path.join(root, 'package-lock.json'), JSON.stringify({ lockfileVersion: 3, packages: Object.fromEntries(Object.entries(locked).map(([name, version]) => [`node_modules/${name}`, { version }])) }));
    // As an older version's npm ci left them: one the same, one it did not have, one at its older major.
    const install = async (versions: Record<string, string>) => {
      for (const [name, version] of Object.entries(versions)) {
        await mkdir(path.join(root, 'node_modules', name), { recursive: true });
        await writeFile(path.join(root, 'node_modules', name, 'package.json'), JSON.stringify({ name, version }));
      }
    };
    await install({ kept: '1.0.3', bumped: '8.4.0' });
    await expect(prestart()).rejects.toMatchObject({
      code: 1,
      // After npm's own warnings, if any.
      stderr: expect.stringMatching(
        /(^|\n)node_modules does not hold the dependencies package-lock.json names \(added: not installed, locked 2\.1\.0; bumped: 8\.4\.0, locked 9\.0\.1\): after updating the checkout \(git pull\), run "npm ci", then build or start again\n$/,
      ),
    });
    expect(await builds()).toBe(0);
    await install(locked);
    await prestart();
    expect(await builds()).toBe(1);
  });

  it('runs the build with the npm that started it (npm_execpath), by node, as on Windows where `npm` alone cannot be spawned', async () => {
    // A stand-in npm that notes how it was called and builds nothing.
    const npm = path.join(root, 'fake-npm.cjs');
    await writeFile(npm, "require('fs').writeFileSync('npm-args', JSON.stringify(process.argv.slice(2)));\n");
    await run(process.execPath, [SCRIPT], { cwd: root, env: { ...process.env, npm_execpath: npm } });
    expect(JSON.parse(await readFile(path.join(root, 'npm-args'), 'utf8'))).toEqual(['run', 'build']);
    expect(await builds()).toBe(0);
  });
});
