import { describe, expect, it } from 'vitest';
import { Metrics } from '../src/observability/metrics.js';
import { startTestServer, TEST_KEY } from './helpers/api-server.js';
import { capturedLogs } from './helpers/logs.js';

/** The value of one sample line of Prometheus text, by its name and labels as written. */
function sample(text: string, series: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

describe('duration histograms', () => {
  it('tell apart the long runs of real models on a CPU: a 15-minute batch and a 12-minute load fall in finite buckets', async () => {
    const metrics = new Metrics();
    metrics.batchFinished({ model: 'sdxl', images: 4, steps: 30, seconds: 900, outcome: 'completed' });
    metrics.modelLoaded('flux', 700);
    const text = await metrics.registry.metrics();
    const generation = (le: string) => sample(text, `imagegen_generation_duration_seconds_bucket{le="${le}",model="sdxl",outcome="completed"}`);
    expect([generation('600'), generation('1800'), generation('+Inf')]).toEqual([0, 1, 1]);
    const load = (le: string) => sample(text, `imagegen_model_load_duration_seconds_bucket{le="${le}",model="flux"}`);
    expect([load('300'), load('1800')]).toEqual([0, 1]);
  });
});

describe('the request lines of scrapes and probes', () => {
  it("go out at debug level, not at info as a client's requests do: Prometheus scrapes every 15 s and probes poll more often", async () => {
    const logs = capturedLogs<{ level: number; msg: string; req?: { url: string }; reqId: string }>('debug');
    const server = await startTestServer({ logger: logs.logger });
    try {
      const authorization = `Bearer ${TEST_KEY}`;
      for (const url of ['/metrics', '/health', '/ready', '/v1/models']) await (await fetch(`${server.origin}${url}`, { headers: { authorization } })).arrayBuffer();
      // A scraper with a wrong key is polled too: its 401s every 15 s would fill the log all the same.
      expect((await fetch(`${server.origin}/metrics`)).status).toBe(401);
      // Each request's lines, 'incoming request' and 'request completed', at the level of its first (the URL's).
      const levels = new Map<string, number[]>();
      const urlOf = new Map(logs.lines.filter((line) => line.req).map((line) => [line.reqId, line.req!.url]));
      for (const line of logs.lines.filter((l) => l.msg === 'incoming request' || l.msg === 'request completed')) {
        const url = urlOf.get(line.reqId)!;
        levels.set(url, [...(levels.get(url) ?? []), line.level]);
      }
      const [debug, info] = [20, 30];
      expect(Object.fromEntries(levels)).toEqual({
        '/metrics': [debug, debug, debug, debug],
        '/health': [debug, debug],
        '/ready': [debug, debug],
        '/v1/models': [info, info],
      });
    } finally {
      await server.close();
    }
  });

  it("name an SDK's retry (x-stainless-retry-count), which ties it to the try that timed out before it", async () => {
    const logs = capturedLogs<{ msg: string; req?: { url: string; retry?: number } }>();
    const server = await startTestServer({ logger: logs.logger });
    try {
      const authorization = `Bearer ${TEST_KEY}`;
      await (await fetch(`${server.baseURL}/models?first`, { headers: { authorization, 'x-stainless-retry-count': '0' } })).arrayBuffer();
      await (await fetch(`${server.baseURL}/models?again`, { headers: { authorization, 'x-stainless-retry-count': '2' } })).arrayBuffer();
      const incoming = logs.lines.filter((line) => line.msg === 'incoming request').map((line) => line.req);
      expect(incoming).toEqual([expect.not.objectContaining({ retry: expect.anything() }), expect.objectContaining({ retry: 2 })]);
    } finally {
      await server.close();
    }
  });
});
