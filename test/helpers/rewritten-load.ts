import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import onnxProto from 'onnx-proto';
import { MemoryPlan } from '../../src/pipelines/memory-plan.js';
import { graphSource } from '../../src/runtime/graph-rewrite.js';
import { createSession, defaultRuntime } from '../../src/runtime/providers.js';
import { baddbmmGraph, node } from './attention-graph.js';

/**
 * Run as a script the way workers run (node --expose-gc --import tsx): writes a graph with
 * `process.argv[2]` MiB of inline weights and the baddbmm attention that graph-rewrite.ts rewrites,
 * loads it through MemoryPlan.measureLoad as a worker loads a model (as it is, without the rewrite,
 * when `process.argv[3]` is 'plain'), and prints what was measured as JSON:
 * { fileBytes, weightsBytes, rewritten }.
 */

const { onnx } = onnxProto;
const FLOAT = onnx.TensorProto.DataType.FLOAT;
const rows = 64;
const cols = Math.round((Number(process.argv[2]) * 2 ** 20) / (rows * 4));
const graph = baddbmmGraph();
// q is x projected by the weights: [4, rows] x [rows, cols].
graph.node!.unshift(node('MatMul', ['x', 'weights'], ['q']));
graph.initializer!.push(
  { name: 'weights', dataType: FLOAT, dims: [rows, cols], rawData: new Uint8Array(rows * cols * 4).fill(1) },
  { name: 'alpha', dataType: FLOAT, dims: [], rawData: new Uint8Array(new Float32Array([0.1]).buffer) },
);
graph.input = [
  { name: 'x', type: { tensorType: { elemType: FLOAT, shape: { dim: [{ dimValue: 4 }, { dimValue: rows }] } } } },
  { name: 'k', type: { tensorType: { elemType: FLOAT, shape: { dim: [{ dimValue: cols }, { dimValue: 4 }] } } } },
];
graph.output = [{ name: 'probs', type: { tensorType: { elemType: FLOAT } } }];
const bytes = onnx.ModelProto.encode({ irVersion: 8, opsetImport: [{ domain: '', version: 17 }], graph: { name: 'attention', ...graph } }).finish();

const dir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-rewritten-load-'));
try {
  const file = path.join(dir, 'model.onnx');
  await writeFile(file, bytes);
  const plan = new MemoryPlan();
  let rewritten = false;
  await plan.measureLoad(dir, undefined, async () => {
    const source = process.argv[3] === 'plain' ? file : await graphSource(file, 'cpu');
    rewritten = typeof source !== 'string';
    return createSession(source, { ...defaultRuntime(), provider: 'cpu' });
  });
  console.log(JSON.stringify({ fileBytes: bytes.length, weightsBytes: plan.of(dir)?.weightsBytes, rewritten }));
} finally {
  await rm(dir, { recursive: true, force: true });
}
