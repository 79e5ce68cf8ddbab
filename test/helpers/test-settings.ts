/**
 * Settings that every server and CLI process a test starts gets unless the test gives its own: through
 * startRealServer's and spawnServer's environments, and through vitest's (vitest.config.ts `env`) to
 * the processes that inherit it; exportsRuntime (real-exports.ts) takes the same threads.
 *
 * WORKER_THREADS=1: vitest runs two test files at a time, one per core of a 2-core machine, and a worker
 * with the default share of the cores (every core, for one worker) gave each of its onnxruntime sessions
 * a thread per core, twice as many as the cores left it: the threads waited on each other between
 * operators, the same work took more of the cores (about 6% of the suite's). The tests of the thread
 * setting itself give it (startup-log, ops-engine's worker threads), as do memory-oom's data-size
 * limits, which count each thread's stack.
 */
export const TEST_SETTINGS: Readonly<Record<string, string>> = { WORKER_THREADS: '1' };
