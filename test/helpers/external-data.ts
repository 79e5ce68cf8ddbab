import { readFile, rename, writeFile } from 'node:fs/promises';
import path from 'node:path';
import onnxProto from 'onnx-proto';
import type { onnx as proto } from 'onnx-proto';

const { onnx } = onnxProto;

/**
 * Moves the numbers of every initializer of `model` that has them inline out to one file, `location`
 * beside the graph, as exporters save graphs over 2 GB; returns that file's bytes.
 */
export function moveWeightsOut(model: proto.IModelProto, location = 'model.onnx_data'): Uint8Array {
  const weights: Uint8Array[] = [];
  let offset = 0;
  for (const tensor of model.graph!.initializer!) {
    if (!tensor.rawData?.length) continue;
    weights.push(tensor.rawData);
    tensor.externalData = [
      { key: 'location', value: location },
      { key: 'offset', value: String(offset) },
      { key: 'length', value: String(tensor.rawData.length) },
    ];
    tensor.dataLocation = onnx.TensorProto.DataLocation.EXTERNAL;
    offset += tensor.rawData.length;
    tensor.rawData = new Uint8Array(0);
  }
  return Buffer.concat(weights);
}

/**
 * Renames the external weights file of the graph `onnxFile` to `name`, as another exporter would have
 * written it: onnxruntime opens the location stored in each initializer, so the graph is re-saved
 * with the new location as well.
 */
export async function renameExternalData(onnxFile: string, name: string): Promise<void> {
  const model = onnx.ModelProto.decode(await readFile(onnxFile));
  const locations = new Set<string>();
  for (const tensor of model.graph?.initializer ?? []) {
    for (const entry of tensor.externalData ?? []) {
      if (entry.key !== 'location') continue;
      locations.add(entry.value!);
      entry.value = name;
    }
  }
  if (locations.size !== 1) throw new Error(`${onnxFile} has ${locations.size} external weights files; expected one`);
  await writeFile(onnxFile, onnx.ModelProto.encode(model).finish());
  const dir = path.dirname(onnxFile);
  await rename(path.join(dir, [...locations][0]), path.join(dir, name));
}
