import { Writable } from 'node:stream';
import { pino } from 'pino';

/** A logger that writes nothing, for the parts under test whose logs no test reads. */
export const silentLogger = pino({ level: 'silent' });

/** A logger at level info whose lines the test reads: parsed, and as written (`raw`). */
export function capturedLogs<Line>() {
  const lines: Line[] = [];
  const raw: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _encoding, done) {
      raw.push(chunk.toString());
      lines.push(JSON.parse(chunk.toString()) as Line);
      done();
    },
  });
  return { logger: pino({ level: 'info' }, sink), lines, raw };
}
