import { readFile, truncate, writeFile } from 'node:fs/promises';
import path from 'node:path';
import onnxProto from 'onnx-proto';
import type { onnx as proto } from 'onnx-proto';

/**
 * Model folders whose components weigh what a test needs without taking disk: the weight is all zeros,
 * kept in a sparse model.onnx_data, and a MatMul prepacks it as its session is created, so that creating
 * the session allocates it at once (under a data-size limit, where it fails there).
 */

const { onnx } = onnxProto;
const FLOAT = onnx.TensorProto.DataType.FLOAT;

/** A float32 initializer of `dims` in the component's model.onnx_data (see writeComponent). */
function externalWeight(name: string, dims: number[]): proto.ITensorProto {
  const length = dims.reduce((a, b) => a * b, 4);
  return {
    name,
    dataType: FLOAT,
    dims,
    dataLocation: onnx.TensorProto.DataLocation.EXTERNAL,
    externalData: [
      { key: 'location', value: 'model.onnx_data' },
      { key: 'offset', value: '0' },
      { key: 'length', value: String(length) },
    ],
  };
}

/** Writes `model` as the component's graph, with `weightBytes` of zeros as its model.onnx_data (sparse: no disk). */
async function writeComponent(modelDir: string, component: string, model: proto.IModelProto, weightBytes: number): Promise<void> {
  const dir = path.join(modelDir, component);
  await writeFile(path.join(dir, 'model.onnx'), onnx.ModelProto.encode(model).finish());
  await writeFile(path.join(dir, 'model.onnx_data'), '');
  await truncate(path.join(dir, 'model.onnx_data'), weightBytes);
}

/**
 * Replaces `component`'s graph in a model folder with one whose single weight is 2 GiB (a MatMul of
 * [1, 16384] by [16384, 32768]): a component that cannot run, only fail to load.
 */
export async function makeHeavy(modelDir: string, component: string): Promise<void> {
  const [rows, cols] = [16384, 32768];
  const tensor = (name: string, dims: number[]) => ({ name, type: { tensorType: { elemType: FLOAT, shape: { dim: dims.map((dimValue) => ({ dimValue })) } } } });
  const model: proto.IModelProto = {
    irVersion: 8,
    opsetImport: [{ domain: '', version: 17 }],
    graph: {
      name: 'heavy',
      node: [{ opType: 'MatMul', input: ['x', 'w'], output: ['y'] }],
      input: [tensor('x', [1, rows])],
      output: [tensor('y', [1, cols])],
      initializer: [externalWeight('w', [rows, cols])],
    },
  };
  await writeComponent(modelDir, component, model, rows * cols * 4);
}

/**
 * Gives a model folder's VAE decoder or encoder (`component`) about `bytes` more weight while it still
 * computes what it did: a side branch flattens its input to [1, inputValues], multiplies that by a
 * [inputValues, M] weight of zeros, sums the product, multiplies the sum by 0 and adds it to the output.
 * Its output is unchanged, but only at the one size whose input (of one image) holds `inputValues`
 * values: at any other the Reshape fails.
 */
export async function makeHeavyVae(modelDir: string, component: 'vae_decoder' | 'vae_encoder', bytes: number, inputValues: number): Promise<void> {
  const model = onnx.ModelProto.decode(await readFile(path.join(modelDir, component, 'model.onnx')));
  const graph = model.graph!;
  const [input] = graph.input!;
  const [output] = graph.output!;
  const computed = `${output.name}_computed`;
  for (const node of graph.node!) node.output = node.output!.map((name) => (name === output.name ? computed : name));
  const columns = Math.ceil(bytes / (4 * inputValues));
  graph.initializer!.push(
    externalWeight('heavy_weight', [inputValues, columns]),
    { name: 'heavy_shape', dataType: onnx.TensorProto.DataType.INT64, dims: [2], int64Data: [1, inputValues] },
    { name: 'heavy_zero', dataType: FLOAT, dims: [], floatData: [0] },
  );
  graph.node!.push(
    { opType: 'Reshape', input: [input.name!, 'heavy_shape'], output: ['heavy_flat'] },
    { opType: 'MatMul', input: ['heavy_flat', 'heavy_weight'], output: ['heavy_product'] },
    { opType: 'ReduceSum', input: ['heavy_product'], output: ['heavy_sum'] },
    { opType: 'Mul', input: ['heavy_sum', 'heavy_zero'], output: ['heavy_nothing'] },
    { opType: 'Add', input: [computed, 'heavy_nothing'], output: [output.name!] },
  );
  await writeComponent(modelDir, component, model, inputValues * columns * 4);
}
