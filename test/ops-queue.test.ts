import { describe, expect, it, vi } from 'vitest';
import { loadConfig } from '../src/config.js';
import { JobQueue, QueueFullError, QueueTimeoutError } from '../src/engine/job-queue.js';

/** The queue's time limit and changing concurrency, and the operations settings. */

const forever = () => new Promise<never>(() => undefined);

describe('JobQueue waiting limits', () => {
  it('fails a job that waited longer than maxWaitMs with QueueTimeoutError and a retry hint', async () => {
    vi.useFakeTimers();
    try {
      const waits: number[] = [];
      const queue = new JobQueue(1, 4, { maxWaitMs: 2000, onWaited: (ms) => waits.push(ms) });
      void queue.run(forever);
      const waiting = queue.run(async () => 'never').catch((e: unknown) => e);
      await vi.advanceTimersByTimeAsync(1999);
      expect(queue.load()).toEqual({ running: 1, queued: 1 });
      await vi.advanceTimersByTimeAsync(1);
      const err = (await waiting) as QueueTimeoutError;
      expect(err).toBeInstanceOf(QueueTimeoutError);
      expect(err.waitedSeconds).toBe(2);
      expect(err.retryAfterSeconds).toBeGreaterThanOrEqual(1);
      expect(queue.load()).toEqual({ running: 1, queued: 0 });
      // The running job's wait (none), and the one that gave up after its 2 s.
      expect(waits).toEqual([0, 2000]);
    } finally {
      vi.useRealTimers();
    }
  });

  it('never times out a job once it runs, nor one that left', async () => {
    vi.useFakeTimers();
    try {
      const queue = new JobQueue(1, 4, { maxWaitMs: 100 });
      let finish!: (value: string) => void;
      const running = queue.run(() => new Promise<string>((resolve) => (finish = resolve)));
      const client = new AbortController();
      const left = queue.run(async () => 'never', client.signal).catch((e: unknown) => e);
      client.abort('gone');
      expect(await left).toBe('gone');
      await vi.advanceTimersByTimeAsync(1000);
      finish('done');
      expect(await running).toBe('done');
    } finally {
      vi.useRealTimers();
    }
  });

  it('holds jobs while no worker is ready and starts them as workers become ready', async () => {
    const queue = new JobQueue(0, 2);
    const started: number[] = [];
    const jobs = [1, 2].map((i) => queue.run(async () => started.push(i)));
    expect(queue.load()).toEqual({ running: 0, queued: 2 });
    // Still bounded: a third waits beyond QUEUE_MAX.
    await expect(queue.run(async () => 3)).rejects.toBeInstanceOf(QueueFullError);
    queue.setConcurrency(1);
    await Promise.all(jobs);
    expect(started).toEqual([1, 2]);
  });
});

describe('operations settings', () => {
  it('default to a 2-minute queue wait, a 30 s shutdown, the default model preloaded, private metrics and prompts', () => {
    expect(loadConfig({}, { DEFAULT_MODEL: 'sdxl' })).toMatchObject({
      queueTimeoutSeconds: 120,
      shutdownTimeoutSeconds: 30,
      preload: ['sdxl'],
      metricsPublic: false,
      logPrompts: false,
    });
  });

  it('read PRELOAD as a list, "none" meaning nothing', () => {
    expect(loadConfig({}, { PRELOAD: 'sdxl, flux' }).preload).toEqual(['sdxl', 'flux']);
    expect(loadConfig({}, { PRELOAD: 'none' }).preload).toEqual([]);
    expect(loadConfig({ preload: 'none', metricsPublic: 'true', logPrompts: 'yes' }, {})).toMatchObject({ preload: [], metricsPublic: true, logPrompts: true });
  });
});
