/**
 * A line a process running onnxruntime wrote to its stdout or stderr, as a line of the server's log.
 * onnxruntime's native logger writes its warnings and errors there itself, beside the JavaScript API
 * (a model's unused initializers, nodes an execution provider does not run, a provider library that
 * does not load), as
 *
 *   \x1b[0;93m2026-11-28 10:25:04.509017248 [W:onnxruntime:, graph.cc:5607 CleanUnusedInitializersAndNodeArgs] Removing initializer 'x'. ...\x1b[m
 *
 * in ANSI colours whether its output is a terminal or not: a worker's such lines reached the server's
 * log file or journal as bare text with escape codes among its JSON lines (which journalctl shows as
 * "[N blob data]"). Its severity becomes the line's level, its place in onnxruntime's code a field,
 * and its time and colours go (the log line has its own time).
 */
import type { Readable } from 'node:stream';

export type OutputLevel = 'debug' | 'info' | 'warn' | 'error' | 'fatal';

export interface OutputLine {
  level: OutputLevel;
  message: string;
  /** onnxruntime's line, or other text written to the stream named. */
  from: 'onnxruntime' | 'stdout' | 'stderr';
  /** Where in onnxruntime's code it was said, e.g. "graph.cc:5607 CleanUnusedInitializersAndNodeArgs". */
  source?: string;
}

/** Colour and cursor sequences (CSI ... letter). */
const TERMINAL_ESCAPES = /\x1b\[[0-9;?]*[A-Za-z]/g;

/** "<date> <time> [<severity>:<category>:<logger id>, <file>:<line> <function>] <message>" (onnxruntime's ostream sink). */
const ONNXRUNTIME_LINE = /^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[([VIWEF]):[^:\]]*:[^,\]]*, ([^\]]*)\] ?(.*)$/;

const SEVERITY: Record<string, OutputLevel> = { V: 'debug', I: 'info', W: 'warn', E: 'error', F: 'fatal' };

/** `line` of `stream` as a log line; undefined for one with nothing to say (blank, or colour codes alone). Text not onnxruntime's keeps the stream's level: stderr's warn, stdout's info. */
export function readOutputLine(line: string, stream: 'stdout' | 'stderr'): OutputLine | undefined {
  const text = line.replace(TERMINAL_ESCAPES, '').trim();
  if (text === '') return undefined;
  const said = ONNXRUNTIME_LINE.exec(text);
  if (!said) return { level: stream === 'stderr' ? 'warn' : 'info', message: text, from: stream };
  return { level: SEVERITY[said[1]], message: said[3], from: 'onnxruntime', source: said[2] };
}

/** The longest piece of one line logged as one: a line longer is logged in pieces this long. */
const MAX_OUTPUT_LINE = 16 * 1024;

/**
 * Calls `onLine` with each line `input` carries (without its newline; blank ones aside), a line longer than `max` characters
 * in pieces of `max`, and what is left at its end. Our own rather than node:readline, which holds a line
 * whole until its newline comes: a native library writing in a loop without one would grow the server's
 * memory without bound.
 */
export function eachOutputLine(input: Readable, onLine: (line: string) => void, max = MAX_OUTPUT_LINE): void {
  let pending = '';
  const emit = (line: string) => {
    for (let start = 0; start < line.length; start += max) onLine(line.slice(start, start + max));
  };
  input.setEncoding('utf8');
  input.on('data', (chunk: string) => {
    const lines = (pending + chunk).split('\n');
    pending = lines.pop()!;
    lines.forEach(emit);
    // A piece of max characters is logged now; the rest waits for its newline.
    const whole = pending.length - (pending.length % max);
    emit(pending.slice(0, whole));
    pending = pending.slice(whole);
  });
  input.on('end', () => emit(pending));
}
