import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    globalSetup: ['test/global-setup.ts'],
    testTimeout: 120_000,
    hookTimeout: 120_000,
    // Each test file runs ONNX sessions and sometimes a server with worker threads: two at a time is
    // what a 2-core machine takes without the timing-sensitive tests starving.
    pool: 'forks',
    maxWorkers: 2,
  },
});
