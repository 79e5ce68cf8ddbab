import type { Row } from './report.js';
import { startBenchServer } from './bench-server.js';
import { ms, sideBySide } from './stats.js';

/**
 * What the HTTP layer adds to a generation: the same request over HTTP (parsing, planning, delivery as
 * url or b64_json, serialisation, transfer) and in-process (its batches handed to the same worker
 * pool), taking turns, for small and large sizes and n = 1 and 10, with the embedded model.
 */

const SIZES = [256, 1024];
const COUNTS = [1, 10];
const FORMATS = ['url', 'b64_json'] as const;
/** Rounds per case: n=10 at 1024 takes about a second a run here. */
const rounds = (n: number) => (n === 1 ? 9 : 3);

export async function measureHttpOverhead(): Promise<Row[]> {
  const bench = await startBenchServer();
  const rows: Row[] = [];
  try {
    for (const size of SIZES) {
      for (const n of COUNTS) {
        for (const format of FORMATS) {
          const body = { model: 'demo-shapes', prompt: 'a red circle', n, size: `${size}x${size}`, response_format: format, seed: 7 };
          await bench.overHttp(body);
          const [inProcess, overHttp] = await sideBySide([() => bench.inProcess(body), () => bench.overHttp(body)], rounds(n));
          const ratio = overHttp / inProcess;
          rows.push({ group: 'HTTP vs in-process', case: `${format} n=${n} ${size}x${size} demo`, baseline: ms(inProcess), measured: ms(overHttp), ratio, goal: '<= 1.05', met: ratio <= 1.05 });
        }
      }
    }
  } finally {
    await bench.close();
  }
  return rows;
}
