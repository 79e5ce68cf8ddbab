import { describe, expect, it, vi } from 'vitest';
import { Progress } from '../src/util/progress.js';

/** A log (not a terminal): a plain line every few seconds. */
function log() {
  const lines: string[] = [];
  return { lines, out: { isTTY: false, write: (text: string) => void lines.push(text) } };
}

describe('progress lines when the wall clock steps', () => {
  it('goes on saying the progress and its rate after the wall clock stepped back an hour (NTP, a resumed VM)', () => {
    vi.useFakeTimers({ toFake: ['Date', 'performance'] });
    try {
      const { lines, out } = log();
      const progress = new Progress(out, 'model.onnx', 1000);
      progress.add(100);
      vi.setSystemTime(Date.now() - 3600_000);
      vi.advanceTimersByTime(20_000);
      progress.add(100);
      // On the wall clock the last line lay an hour ahead: none for the hour, and no rate.
      expect(lines).toHaveLength(2);
      expect(lines[1]).toMatch(/^model\.onnx: 20% {2}200 B \/ 1000 B {2}10 B\/s {2}ETA 1:20\n$/);
    } finally {
      vi.useRealTimers();
    }
  });
});
