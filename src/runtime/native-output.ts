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
