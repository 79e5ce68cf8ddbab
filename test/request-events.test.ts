import { describe, expect, it, vi } from 'vitest';
import { requestProgress, type RequestEvent } from '../src/service/request-events.js';
import type { GenerationBatch } from '../src/runtime/types.js';

/**
 * What a streamed request hears while it waits: the queue's count every second (QUEUED_EVENT_MS), from
 * the queue's own counts, which these tests set as a queue would be at each moment.
 */

const batch: GenerationBatch = { modelDir: 'demo', width: 256, height: 256, steps: 4, guidanceScale: 0, items: [{ prompt: 'a red circle', negativePrompt: '', seed: 1 }] };

describe('queued_ahead while a request waits', () => {
  it('says 0 once a worker took the request after it was told of batches ahead, not the last count until its first step', () => {
    vi.useFakeTimers({ toFake: ['setImmediate', 'clearImmediate', 'setInterval', 'clearInterval'] });
    try {
      const heard: RequestEvent[] = [];
      // Its own batch and two others wait; then a worker takes its batch, whose model loads for seconds.
      let queued = 3;
      let started = false;
      const progress = requestProgress([batch], 4, () => queued, () => started, (event) => heard.push(event));
      vi.advanceTimersByTime(1500);
      expect(heard).toEqual([{ type: 'queued', ahead: 2 }, { type: 'queued', ahead: 2 }]);
      started = true;
      queued = 2;
      vi.advanceTimersByTime(5000);
      // Once, however long the load takes; before, the request was left at "2 ahead" until its first step.
      expect(heard.slice(2)).toEqual([{ type: 'queued', ahead: 0 }]);
      progress.listener(0)({ type: 'step', step: 1, total: 4 });
      expect(heard.at(-1)).toEqual({ type: 'step', step: 1, total: 4 });
    } finally {
      vi.useRealTimers();
    }
  });

  it('says 0 once when a worker took it at once', () => {
    vi.useFakeTimers({ toFake: ['setImmediate', 'clearImmediate', 'setInterval', 'clearInterval'] });
    try {
      const heard: RequestEvent[] = [];
      requestProgress([batch], 4, () => 2, () => true, (event) => heard.push(event));
      vi.advanceTimersByTime(5000);
      expect(heard).toEqual([{ type: 'queued', ahead: 0 }]);
    } finally {
      vi.useRealTimers();
    }
  });
});
