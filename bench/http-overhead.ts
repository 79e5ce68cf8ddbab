import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Row } from './report.js';
import { postJson, startBenchServer } from './bench-server.js';
import { ms, sideBySide } from './stats.js';

/**
 * What the HTTP layer adds to a generation: the same request over HTTP (parsing, planning, delivery as
 * url or b64_json, serialisation, transfer) and in-process (its batches handed to the same worker
 * pool), taking turns, for small and large sizes and n = 1 and 10, with the embedded model.
 *
 * Beside each, the floor of any HTTP server on this machine: a bare node:http server in the same
 * process answering the same number of bytes at once, through the same client. In-process plus its
 * round trip is the fastest an answer over HTTP could come here; where that alone passes the goal's
 * 1.05, the server's own work cannot be what misses it.
 */

const SIZES = [256, 1024];
const COUNTS = [1, 10];
const FORMATS = ['url', 'b64_json'] as const;
/** Rounds per case: n=10 at 1024 takes about a second a run here. */
const rounds = (n: number) => (n === 1 ? 9 : 3);

/** A server that answers every request with `answerBytes` bytes of JSON-looking text, reading nothing into it. */
async function startBareServer(): Promise<{ url: string; answerBytes: number; close(): Promise<void> }> {
  const bare = {
    url: '',
    answerBytes: 0,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => res.setHeader('content-type', 'application/json').end(Buffer.alloc(bare.answerBytes, 'a')));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  bare.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/`;
  return bare;
}

export async function measureHttpOverhead(): Promise<Row[]> {
  const bench = await startBenchServer();
  const bare = await startBareServer();
  const rows: Row[] = [];
  try {
    for (const size of SIZES) {
      for (const n of COUNTS) {
        for (const format of FORMATS) {
          const body = { model: 'demo-shapes', prompt: 'a red circle', n, size: `${size}x${size}`, response_format: format, seed: 7 };
          bare.answerBytes = (await bench.overHttp(body)).bytes;
          const [inProcess, overHttp, roundTrip] = await sideBySide([() => bench.inProcess(body), () => bench.overHttp(body), () => postJson(bare.url, body)], rounds(n));
          const ratio = overHttp / inProcess;
          const label = `${format} n=${n} ${size}x${size} demo`;
          rows.push({ group: 'HTTP vs in-process', case: label, baseline: ms(inProcess), measured: ms(overHttp), ratio, goal: '<= 1.05', met: ratio <= 1.05 });
          rows.push({
            group: 'HTTP floor',
            case: `${label}: in-process + a bare server's round trip of its ${Math.ceil(bare.answerBytes / 1024)} KiB`,
            baseline: ms(inProcess),
            measured: ms(inProcess + roundTrip),
            ratio: (inProcess + roundTrip) / inProcess,
          });
        }
      }
    }
  } finally {
    await bare.close();
    await bench.close();
  }
  return rows;
}
