import path from 'node:path';
import { pino } from 'pino';
import { EMBEDDED_MODELS_DIR } from '../src/config.js';
import { parseGenerationRequest } from '../src/api/wire.js';
import { ModelRegistry, modelRoots, type ModelEntry } from '../src/models/registry.js';
import type { GenerationBatch } from '../src/runtime/types.js';
import type { RunningServer } from '../src/server.js';
import { planBatches } from '../src/service/plan.js';
import { startRealServer } from '../test/helpers/real-server.js';

/**
 * The whole server in this process (HTTP app, image store, worker pool) with the given model folders
 * installed beside the embedded model, and two ways to make the same images: over HTTP as a client
 * does, and in-process, handing the batches the service would plan straight to the same worker pool.
 * The difference between the two is what the HTTP layer adds (parsing, delivery, serialisation,
 * transfer).
 */

export interface BenchServer {
  server: RunningServer;
  /** POSTs a generation request (postJson) and answers the milliseconds it took, the answer's size and the server's own generateMs for it. */
  overHttp(body: Record<string, unknown>): Promise<{ ms: number; bytes: number; generateMs: number }>;
  /** The same request's batches, planned as the service plans them, run on the same pool. */
  inProcess(body: Record<string, unknown>): Promise<void>;
  /** The batches the service would plan for a request (its model resolved as the server does). */
  plan(body: Record<string, unknown>): Promise<{ model: ModelEntry; batches: GenerationBatch[] }>;
  close(): Promise<void>;
}

interface LogLine {
  msg?: string;
  generateMs?: number;
}

/** POSTs `body` as JSON and reads the whole answer, unparsed (as a proxy would); throws unless it is a 200. */
export async function postJson(url: string, body: Record<string, unknown>): Promise<{ ms: number; bytes: number }> {
  const started = performance.now();
  const res = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const answer = await res.arrayBuffer();
  const ms = performance.now() - started;
  if (res.status !== 200) throw new Error(`${url} answered ${res.status}: ${Buffer.from(answer).toString().slice(0, 300)}`);
  return { ms, bytes: answer.byteLength };
}

export async function startBenchServer(models: Record<string, string> = {}, env: Record<string, string> = {}): Promise<BenchServer> {
  // The server's own log says how long each request's generation took; the HTTP part is the rest.
  const generateMs: number[] = [];
  const logger = pino(
    { level: 'info' },
    {
      write(line: string) {
        const entry = JSON.parse(line) as LogLine & { level: number };
        if (entry.msg === 'images generated') generateMs.push(entry.generateMs!);
        // Errors say why a measurement failed.
        if (entry.level >= 50) process.stderr.write(line);
      },
    },
  );
  const real = await startRealServer({
    models: Object.fromEntries(Object.entries(models).map(([name, dir]) => [name, { link: dir }])),
    env: { WORKERS: '1', PRELOAD: Object.keys(models).join(',') || 'demo-shapes', ...env },
    logger,
  });
  const { server } = real;
  const registry = new ModelRegistry({ roots: modelRoots(path.join(real.root, 'models'), EMBEDDED_MODELS_DIR), aliases: {}, logger: pino({ level: 'silent' }) });
  await registry.scan();
  while (!server.engine.readiness().ready) await new Promise((resolve) => setTimeout(resolve, 20));
  const plan = async (body: Record<string, unknown>) => {
    const request = parseGenerationRequest(body);
    const model = await registry.resolve(request.model);
    if (!model) throw new Error(`model '${request.model}' is not installed`);
    return { model, batches: planBatches(request, model) };
  };
  return {
    server,
    async overHttp(body) {
      const { ms, bytes } = await postJson(`${server.url}/v1/images/generations`, body);
      return { ms, bytes, generateMs: generateMs.at(-1)! };
    },
    plan,
    async inProcess(body) {
      const { batches } = await plan(body);
      const ticket = server.engine.ticket(batches, 'bench');
      await Promise.all(batches.map((batch) => server.engine.generate(batch, undefined, ticket)));
    },
    async close() {
      registry.close();
      await real.close();
    },
  };
}
