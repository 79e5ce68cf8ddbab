import { formatBytes } from './bytes.js';
import { printable } from './printable.js';

/**
 * Progress of long work (a download in bytes, a generation in denoising steps), for humans on stderr: a
 * bar redrawn in place on a terminal, plain lines (one per finished file, and one every few seconds
 * during big ones) in logs.
 */

export interface ProgressOutput {
  write(text: string): unknown;
  isTTY?: boolean;
  /** A terminal's width in characters (a tty.WriteStream's, read at each redraw: the window may be resized). */
  columns?: number;
}

/** How amounts and rates of what is counted are shown. */
export interface ProgressUnit {
  amount(n: number): string;
  rate(perSecond: number): string;
}

const BYTES: ProgressUnit = { amount: formatBytes, rate: (r) => `${formatBytes(r)}/s` };
export const STEPS: ProgressUnit = { amount: (n) => `${Math.round(n)} steps`, rate: (r) => `${r.toFixed(r < 10 ? 1 : 0)} steps/s` };

const REDRAW_MS = 100;
const PLAIN_LINE_MS = 10_000;
const BAR_WIDTH = 24;

function formatDuration(seconds: number): string {
  const s = Math.round(seconds);
  const hours = Math.floor(s / 3600);
  const minutes = Math.floor((s % 3600) / 60);
  const rest = String(s % 60).padStart(2, '0');
  return hours ? `${hours}:${String(minutes).padStart(2, '0')}:${rest}` : `${minutes}:${rest}`;
}

export class Progress {
  /**
   * Times on the monotonic clock: on the wall clock, a step back (NTP, a VM resumed) held off every line
   * for as long as the step and showed no rate; a step ahead showed the rate as if the step were spent working.
   */
  private readonly startedAt: number;
  private readonly doneAtStart: number;
  private lastLine = -Infinity;
  private file = '';

  /**
   * `total` and `done` are counted in `unit` (bytes unless told). `done`: what was done before this
   * progress began (a resumed download's bytes); it does not count towards the rate.
   */
  constructor(
    private readonly out: ProgressOutput,
    private readonly label: string,
    private readonly total: number,
    private done = 0,
    private readonly unit: ProgressUnit = BYTES,
  ) {
    this.startedAt = performance.now();
    this.doneAtStart = done;
  }

  /** The file now being worked on, shown after the numbers (printable: a pulled repository names its files). */
  startFile(name: string): void {
    this.file = printable(name);
    this.render(false);
  }

  /** `amount` more is done; negative when work starts over (a server that ignores a resume request restarts a file). */
  add(amount: number): void {
    this.done += amount;
    this.render(false);
  }

  /** Passes `source` through, counting its bytes. */
  async *counting(source: AsyncIterable<Uint8Array>): AsyncIterable<Uint8Array> {
    for await (const chunk of source) {
      this.add(chunk.length);
      yield chunk;
    }
  }

  fileDone(): void {
    if (!this.out.isTTY) this.render(true);
  }

  /**
   * A step callback for one denoising loop that takes `steps` of the bar: the loop's own count is scaled
   * to that share (PNDM reports a step more than asked; a batch run in parts counts as one loop).
   */
  loop(steps: number): (step: number, total: number) => void {
    let reported = 0;
    return (step, total) => {
      const now = Math.round((step / total) * steps);
      this.add(now - reported);
      reported = now;
    };
  }

  /** Takes the bar off a terminal's line before something else is written there; the next update draws it again. */
  clear(): void {
    if (this.out.isTTY) this.out.write('\r\x1b[K');
    this.lastLine = -Infinity;
  }

  /** A message between progress lines. */
  note(text: string): void {
    this.clear();
    this.out.write(`${text}\n`);
  }

  finish(): void {
    this.file = '';
    this.render(true);
    if (this.out.isTTY) this.out.write('\n');
  }

  /**
   * The bar's line, made to fit the terminal's width: a longer one wraps, and the carriage return of the
   * next redraw goes back to the start of its last row only, so each redraw left a row behind (an
   * 80-column console filled with copies of the bar). Where the bar does not fit, the numbers go without
   * it, cut at the end if need be; the last column stays free, as some terminals wrap on it.
   */
  private fitted(line: string, withoutBar: string): string {
    const width = this.out.columns;
    if (!width || width < 2 || [...line].length < width) return line;
    return [...withoutBar].slice(0, width - 1).join('');
  }

  private render(force: boolean): void {
    const now = performance.now();
    if (!force && now - this.lastLine < (this.out.isTTY ? REDRAW_MS : PLAIN_LINE_MS)) return;
    this.lastLine = now;
    const fraction = this.total > 0 ? Math.min(1, this.done / this.total) : 1;
    const seconds = (now - this.startedAt) / 1000;
    const rate = seconds > 0 ? (this.done - this.doneAtStart) / seconds : 0;
    const numbers = [
      `${Math.floor(fraction * 100)}%`,
      `${this.unit.amount(this.done)} / ${this.unit.amount(this.total)}`,
      ...(rate > 0 ? [this.unit.rate(rate), `ETA ${formatDuration((this.total - this.done) / rate)}`] : []),
    ].join('  ');
    const file = this.file ? `  ${this.file}` : '';
    const plain = `${this.label}: ${numbers}${file}`;
    if (this.out.isTTY) {
      const filled = Math.round(fraction * BAR_WIDTH);
      this.out.write(`\r\x1b[K${this.fitted(`${this.label} [${'='.repeat(filled)}${' '.repeat(BAR_WIDTH - filled)}] ${numbers}${file}`, plain)}`);
    } else {
      this.out.write(`${plain}\n`);
    }
  }
}
