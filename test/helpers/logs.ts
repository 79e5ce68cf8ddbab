import { Writable } from 'node:stream';
import type { Level } from 'pino';
import { createLogger } from '../../src/observability/logger.js';

/** A logger that writes nothing, for the parts under test whose logs no test reads. */
export const silentLogger = createLogger('silent');

/** A logger at `level` (info, the server's default), as the server's writes them (createLogger), whose lines the test reads: parsed, and as written (`raw`). */
export function capturedLogs<Line>(level: Level = 'info') {
  const lines: Line[] = [];
  const raw: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _encoding, done) {
      raw.push(chunk.toString());
      lines.push(JSON.parse(chunk.toString()) as Line);
      done();
    },
  });
  return { logger: createLogger(level, sink), lines, raw };
}
