import { readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import onnxProto from 'onnx-proto';
import { ort } from '../src/runtime/onnxruntime.js';
import { describe, expect, it } from 'vitest';
import type { GenerationBatch } from '../src/runtime/types.js';
import { WorkerRuntime } from '../src/pipelines/run.js';
import { copyOfReference, referenceModel } from './helpers/reference.js';

/** This file's own worker runtime, in this process. */
const runtime = new WorkerRuntime();

const { onnx } = onnxProto;

/**
 * FLUX exports disagree on the dtype of the position ids: diffusers' transformer takes float
 * img_ids/txt_ids, some ONNX exports declare them int64. The pipeline hands float ids to the session,
 * which casts every feed to the type the graph declares; the ids are whole numbers, so a transformer
 * that takes them as int64 must draw exactly the same picture.
 */

/** Re-declares the transformer's `names` inputs as int64, casting them back to float inside the graph. */
async function declareIdsInt64(onnxFile: string, names: string[]): Promise<void> {
  const model = onnx.ModelProto.decode(await readFile(onnxFile));
  const graph = model.graph!;
  for (const name of names) {
    const input = graph.input!.find((i) => i.name === name)!;
    input.type!.tensorType!.elemType = onnx.TensorProto.DataType.INT64;
    const asFloat = `${name}_as_float`;
    for (const node of graph.node!) node.input = node.input!.map((i) => (i === name ? asFloat : i));
    graph.node!.unshift({
      name: `cast_${name}`,
      opType: 'Cast',
      input: [name],
      output: [asFloat],
      attribute: [{ name: 'to', type: onnx.AttributeProto.AttributeType.INT, i: onnx.TensorProto.DataType.FLOAT }],
    });
  }
  await writeFile(onnxFile, onnx.ModelProto.encode(model).finish());
}

const batch = (modelDir: string): GenerationBatch => ({
  modelDir,
  width: 256,
  height: 256,
  steps: 4,
  guidanceScale: 0,
  items: [{ prompt: 'a red circle', negativePrompt: '', seed: 5 }],
});

describe('FLUX with int64 img_ids and txt_ids', () => {
  it('draws the same picture as the float-ids export', async () => {
    const dir = await copyOfReference('flux-schnell');
    const transformer = path.join(dir, 'transformer', 'model.onnx');
    await declareIdsInt64(transformer, ['img_ids', 'txt_ids']);
    const session = await ort.InferenceSession.create(transformer);
    const types = session.inputMetadata.flatMap((m) => (m.isTensor && m.name.endsWith('_ids') ? [[m.name, m.type]] : []));
    await session.release();
    expect(types).toEqual([['img_ids', 'int64'], ['txt_ids', 'int64']]);
    const [expected] = await runtime.generateImages(batch(referenceModel('flux-schnell')));
    const [int64] = await runtime.generateImages(batch(dir));
    expect(Buffer.from(int64.pixels).equals(Buffer.from(expected.pixels))).toBe(true);
  });
});
