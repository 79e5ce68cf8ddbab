import { describe, expect, it, vi } from 'vitest';
import { skippedNote } from '../src/install/model-files.js';
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

describe('the bar on a terminal', () => {
  it("keeps each redraw within the terminal's width, so that a long line does not wrap and leave a row behind at every redraw", () => {
    const writes: string[] = [];
    const terminal = { isTTY: true, columns: 120, write: (text: string) => void writes.push(text) };
    const progress = new Progress(terminal, 'verifying ./models/my-sdxl-turbo-fp16', 7);
    progress.startFile('case 1 (1024x1024, 4 steps)');
    // The window made narrower (clear() lets the next update redraw at once): the numbers go without the bar, then are cut.
    progress.clear();
    terminal.columns = 100;
    progress.startFile('case 2 (1024x1024, 4 steps)');
    progress.clear();
    terminal.columns = 30;
    progress.finish();
    expect(writes.filter((text) => text.length > '\r\x1b[K'.length && text.startsWith('\r\x1b[K'))).toEqual([
      '\r\x1b[Kverifying ./models/my-sdxl-turbo-fp16 [                        ] 0%  0 B / 7 B  case 1 (1024x1024, 4 steps)',
      '\r\x1b[Kverifying ./models/my-sdxl-turbo-fp16: 0%  0 B / 7 B  case 2 (1024x1024, 4 steps)',
      '\r\x1b[Kverifying ./models/my-sdxl-tu',
    ]);
    // Where the width is unknown, the line is written whole.
    const whole: string[] = [];
    new Progress({ isTTY: true, write: (text: string) => void whole.push(text) }, 'verifying ./models/my-sdxl-turbo-fp16', 7).startFile('case 1 (1024x1024, 4 steps)');
    expect(whole).toEqual(['\r\x1b[Kverifying ./models/my-sdxl-turbo-fp16 [                        ] 0%  0 B / 7 B  case 1 (1024x1024, 4 steps)']);
  });
});

describe("file names from a model's repository", () => {
  it('reach the terminal without control sequences, in the bar and in the note of files skipped', () => {
    // A file anyone can put in a Hub repository beside its graph (every file there is downloaded), or anywhere in it (the note names skipped ones).
    const name = 'unet/\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\x07\x1b[2J\u009b31m\u202eweights.bin';
    const writes: string[] = [];
    new Progress({ isTTY: true, columns: 400, write: (text: string) => void writes.push(text) }, 'downloading', 7).startFile(name);
    const note = skippedNote('evil/repo', [name]);
    const control = /[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]/;
    // The bar's own redraw (carriage return, erase line) stays; nothing of the name's.
    expect(writes.map((text) => text.replace(/^\r\x1b\[K/, ''))).toEqual([expect.stringContaining('unet/\\u001b]52;c;Y3VybCBldmlsLmV4YW1wbGUgfCBzaA==\\u0007\\u001b[2J\\u009b31m\\u202eweights.bin')]);
    expect(writes.map((text) => text.replace(/^\r\x1b\[K/, '')).join('')).not.toMatch(control);
    expect(note).toContain('unet/\\u001b]52;c;');
    expect(note.replace(/\n$/, '')).not.toMatch(control);
  });
});
