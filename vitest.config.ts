import path from 'node:path';
import { defineConfig } from 'vitest/config';
import { BaseSequencer, type TestSpecification } from 'vitest/node';
import { settingsHelp } from './src/config.js';
import { withHugePages } from './src/engine/malloc-tunables.js';
import { TEST_SETTINGS } from './test/helpers/test-settings.js';

/**
 * Test files that take minutes on a 2-core machine (the real exports' goldens and size sweeps, the
 * server processes), longest first. Vitest starts the files that took longest in its last run first,
 * but a fresh clone (CI) has no last run and it starts the largest files instead, which left the real
 * exports' HTTP sweep (about 5 minutes) to start late and the whole run waiting on it alone.
 */
const LONGEST = ['real-exports-http', 'real-exports', 'real-exports-fp16', 'ops-process', 'ops-engine', 'memory-oom', 'ops-hardening'];

class LongestFirst extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const rank = (file: TestSpecification) => {
      const at = LONGEST.indexOf(path.basename(file.moduleId, '.test.ts'));
      return at === -1 ? LONGEST.length : at;
    };
    // Array.prototype.sort is stable: the rest keep vitest's own order.
    return (await super.sort(files)).sort((a, b) => rank(a) - rank(b));
  }
}

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    globalSetup: ['test/global-setup.ts'],
    testTimeout: 120_000,
    hookTimeout: 120_000,
    // expect.poll waits for something to happen (a job running, a log line, a socket's answer); vitest's
    // own default gives up after 1 s, which a machine under load (CI's, shared) can take for a single
    // turn of a server's event loop. A poll that must see its event sooner says so in its own timeout.
    expect: { poll: { timeout: 30_000 } },
    // Each test file runs ONNX sessions and sometimes a server with worker threads: two at a time is
    // what a 2-core machine takes without the timing-sensitive tests starving.
    pool: 'forks',
    maxWorkers: 2,
    sequence: { sequencer: LongestFirst },
    // Tests of what a process keeps (not what it allocated for a moment) collect garbage first.
    execArgv: ['--expose-gc'],
    // For the CLI processes tests start with the test's own environment (see TEST_SETTINGS). The test
    // files' processes start with it too (vitest forks them with it), so that the pipelines they run in
    // process (the real exports' goldens) allocate as a server's workers do, in huge pages
    // (malloc-tunables.ts): glibc reads GLIBC_TUNABLES only as a process starts.
    // Every server setting unset (a variable set empty reads as unset: config.ts settingText), but for
    // TEST_SETTINGS: one exported in the shell that runs the tests (DEFAULT_MODEL, API_KEYS, MODELS_DIR,
    // where the server is run from that shell) reached every server and command they start, and failed
    // them. HF_HUB_OFFLINE unset too: the tests pull from Hubs of their own on this machine, which the
    // offline mode an air-gapped site's shell may set would refuse.
    env: {
      ...Object.fromEntries(settingsHelp.map(({ env }) => [env, ''])),
      ...TEST_SETTINGS,
      GLIBC_TUNABLES: withHugePages(process.env.GLIBC_TUNABLES),
      HF_HUB_OFFLINE: '',
    },
  },
});
