import { readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import onnxProto from 'onnx-proto';
import { describe, expect, it } from 'vitest';
import { PassThrough } from 'node:stream';
import { eachOutputLine, readOutputLine } from '../src/runtime/native-output.js';
import { DEMO_MODEL_DIR } from './helpers/demo-model.js';
import { capturedLogs } from './helpers/logs.js';
import { startRealServer } from './helpers/real-server.js';

/**
 * What worker processes write to their stdout and stderr reaches the server's log as its JSON lines:
 * onnxruntime writes its own warnings there, in ANSI colours even into a file or a journal.
 */

const { onnx } = onnxProto;

interface LogLine {
  level: number;
  msg: string;
  worker?: number;
  from?: string;
  source?: string;
}

describe("a worker's output", () => {
  it("is logged as the server's lines, onnxruntime's with its severity and without its colours", async () => {
    const logs = capturedLogs<LogLine>();
    const server = await startRealServer({ models: { unclean: { copy: DEMO_MODEL_DIR } }, logger: logs.logger });
    try {
      // An initializer no node uses, as many exports have: onnxruntime warns that it removes it as the model loads.
      const file = path.join(server.root, 'models', 'unclean', 'vae_decoder', 'model.onnx');
      const model = onnx.ModelProto.decode(await readFile(file));
      model.graph!.initializer!.push(onnx.TensorProto.create({ name: 'unused_by_any_node', dataType: onnx.TensorProto.DataType.FLOAT, dims: [1], floatData: [1] }));
      await writeFile(file, onnx.ModelProto.encode(model).finish());

      await server.client.images.generate({ model: 'unclean', prompt: 'a red circle', response_format: 'b64_json' });
      const warning = () => logs.lines.find((line) => line.msg.includes("Removing initializer 'unused_by_any_node'"));
      await expect.poll(warning, { timeout: 10_000 }).toBeDefined();
      expect(warning()).toEqual(
        expect.objectContaining({
          level: 40,
          worker: 0,
          from: 'onnxruntime',
          source: expect.stringMatching(/^graph\.cc:\d+ CleanUnusedInitializersAndNodeArgs$/),
          msg: "Removing initializer 'unused_by_any_node'. It is not used by any node and should be removed from the model.",
        }),
      );
      expect(logs.raw.filter((line) => line.includes('\\u001b') || line.includes('\x1b'))).toEqual([]);
    } finally {
      await server.close();
    }
  }, 60_000);

  it("reads onnxruntime's severities, and keeps other text at its stream's level", () => {
    const ort = (severity: string) => `\x1b[1;31m2026-11-28 10:25:04.509017248 [${severity}:onnxruntime:Default, provider_bridge_ort.cc:2167 TryGetProviderInfo_CUDA] Failed to load library x.so\x1b[m`;
    expect(readOutputLine(ort('E'), 'stderr')).toEqual({ level: 'error', message: 'Failed to load library x.so', from: 'onnxruntime', source: 'provider_bridge_ort.cc:2167 TryGetProviderInfo_CUDA' });
    expect(['V', 'I', 'W', 'F'].map((severity) => readOutputLine(ort(severity), 'stdout')?.level)).toEqual(['debug', 'info', 'warn', 'fatal']);
    // Node's own last words as a worker runs out of heap, and a line of colour codes alone.
    expect(readOutputLine('FATAL ERROR: Reached heap limit Allocation failed - JavaScript heap out of memory', 'stderr')).toEqual({
      level: 'warn',
      message: 'FATAL ERROR: Reached heap limit Allocation failed - JavaScript heap out of memory',
      from: 'stderr',
    });
    expect(readOutputLine('a line', 'stdout')).toEqual({ level: 'info', message: 'a line', from: 'stdout' });
    expect(readOutputLine('\x1b[m  ', 'stderr')).toBeUndefined();
  });

  it('is read in lines, one with no end logged in pieces as it comes rather than held whole', async () => {
    const input = new PassThrough();
    const lines: string[] = [];
    eachOutputLine(input, (line) => lines.push(line), 10);
    input.write('first\r\nsec');
    input.write('ond\n\nthird line, longer than ten\n');
    expect(lines).toEqual(['first\r', 'second', 'third line', ', longer t', 'han ten']);
    lines.length = 0;
    // A writer that never ends its line: each piece is given as soon as it is whole, and the rest at the end.
    for (let i = 0; i < 7; i++) input.write('x'.repeat(5));
    await new Promise((resolve) => setImmediate(resolve));
    expect(lines).toEqual(['x'.repeat(10), 'x'.repeat(10), 'x'.repeat(10)]);
    input.end('é');
    await new Promise((resolve) => input.once('end', resolve));
    expect(lines.slice(3)).toEqual(['xxxxxé']);
  });
});
