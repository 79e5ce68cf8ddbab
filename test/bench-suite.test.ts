import { execFile, spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync } from 'node:fs';
import { readdir, readFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it, onTestFinished } from 'vitest';
import { PROJECT_ROOT } from './helpers/cli.js';

/**
 * The benchmark suite's command (`npm run bench`, bench/suite.ts) as a user runs it: not its timings
 * (those are the suite's own output), but what it leaves behind when a run is cut short, and the
 * arguments it refuses.
 */

const execFileAsync = promisify(execFile);

/** `npm run bench -- ...args` without npm, in a process group of its own, as a shell starts a job (Ctrl-C reaches the group). */
function startSuite(...args: string[]) {
  const child = spawn(process.execPath, ['--import', 'tsx', 'bench/suite.ts', ...args], { cwd: PROJECT_ROOT, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  let output = '';
  child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
  const exited = once(child, 'exit');
  onTestFinished(async () => {
    if (child.exitCode === null && child.signalCode === null) process.kill(-child.pid!, 'SIGKILL');
    await exited;
  });
  return { child, exited, output: () => output };
}

/** The pids of the processes whose parent is `parent` and that lead a process group of their own (/proc/<pid>/stat: pid (comm) state ppid pgrp). */
async function groupLeadersUnder(parent: number): Promise<number[]> {
  const leaders: number[] = [];
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const stat = await readFile(`/proc/${entry}/stat`, 'utf8').catch(() => '');
    const [ppid, pgrp] = stat.slice(stat.lastIndexOf(')') + 2).split(' ').slice(1, 3).map(Number);
    if (ppid === parent && pgrp === Number(entry)) leaders.push(pgrp);
  }
  return leaders;
}

const groupAlive = (group: number) => {
  try {
    process.kill(-group, 0);
    return true;
  } catch {
    return false;
  }
};

describe('npm run bench', () => {
  it.skipIf(!existsSync('/proc/self/stat'))('stops the server it was timing when the run is interrupted (Ctrl-C), leaving no process behind', async () => {
    const suite = startSuite('--only', 'cold start', '--out', path.join(os.tmpdir(), `bench-${process.pid}.json`));
    // The cold start's servers run in groups of their own (so that npm's children stop with them): every
    // one seen while the suite runs, since once the suite is gone they are nobody's children.
    const servers = new Set<number>();
    let watching = true;
    const watch = (async () => {
      while (watching) {
        for (const group of await groupLeadersUnder(suite.child.pid!)) servers.add(group);
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    })();
    onTestFinished(() => [...servers].filter(groupAlive).forEach((group) => process.kill(-group, 'SIGKILL')));
    await expect.poll(() => servers.size, { timeout: 60_000, interval: 20 }).toBeGreaterThan(0);
    // As a terminal's Ctrl-C does: SIGINT to the foreground job's group, the suite's.
    process.kill(-suite.child.pid!, 'SIGINT');
    await suite.exited;
    watching = false;
    await watch;
    expect(suite.child.exitCode ?? suite.child.signalCode).not.toBe(0);
    // SIGTERM'd, a server shuts down gracefully, its workers given up to 5 s before they are killed: on
    // a loaded machine (the full suite beside it) that took more than the 10 s this waited before.
    await expect.poll(() => [...servers].filter(groupAlive), { timeout: 30_000 }).toEqual([]);
  });

  it('refuses an --only that names no group, saying which there are, before measuring or writing anything', async () => {
    const out = path.join(os.tmpdir(), `bench-only-${process.pid}.json`);
    // npm run bench:encoders's name, and a group's name in another case.
    const suite = startSuite('--only', 'encoders,Time per image', '--out', out);
    await suite.exited;
    expect(suite.child.exitCode).toBe(2);
    expect(suite.output()).toContain("--only: no group starts with 'encoders', 'Time per image'; the groups are 'cold start', 'HTTP vs in-process', 'throughput', 'time per image: demo-shapes'");
    expect(existsSync(out)).toBe(false);
  });

  it('refuses a flag it does not know, or a count that is no number, in one line with exit status 2 (not a stack trace, not a run of nothing)', async () => {
    const cases = [
      ['bench/suite.ts', ['--bogus'], "suite.ts: Unknown option '--bogus'"],
      ['bench/soak.ts', ['--requests', '2k'], "soak.ts: --requests takes a whole number of at least 1, not '2k'"],
    ] as const;
    for (const [script, args, said] of cases) {
      const run = execFileAsync(process.execPath, ['--import', 'tsx', script, ...args], { cwd: PROJECT_ROOT });
      await expect(run).rejects.toMatchObject({ code: 2, stderr: `${said}\n` });
    }
  });
});
