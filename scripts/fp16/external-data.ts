/**
 * The numbers of a graph's external tensors, carried through the float16 conversion. A graph over 2 GB
 * (the float32 UNet or transformer of every real SD, SDXL and FLUX export) keeps its weights in a file
 * beside model.onnx (Optimum's model.onnx_data), as protobuf cannot hold them inline. The conversion
 * retypes such tensors (convert.ts); here their numbers are read one tensor at a time, halved where
 * they were float32, and written to the converted graph's own weights file, so that a 10 GB UNet never
 * sits in memory whole and the converted folder holds no copy of the float32 weights.
 */
import { open, type FileHandle } from 'node:fs/promises';
import path from 'node:path';
import onnxProto from 'onnx-proto';
import type { onnx as proto } from 'onnx-proto';
import { halfBytes, isExternal } from './convert.js';

const { FLOAT, FLOAT16 } = onnxProto.onnx.TensorProto.DataType;

/** An external tensor as the source graph has it, noted before the conversion retypes it. */
export interface ExternalTensor {
  tensor: proto.ITensorProto;
  /** It held float32 numbers (halved if the conversion made it float16). */
  float32: boolean;
  /** Its file, relative to the graph's folder. */
  location: string;
  offset: number;
  /** Absent: to the end of the file, as ONNX reads it. */
  length?: number;
}

/** Every tensor of the model whose numbers lie in an external file: initializers and attribute tensors, in subgraphs too. */
export function externalTensors(model: proto.IModelProto): ExternalTensor[] {
  const found: ExternalTensor[] = [];
  const visitTensor = (tensor: proto.ITensorProto) => {
    if (!isExternal(tensor)) return;
    const entries = new Map((tensor.externalData ?? []).map((entry) => [entry.key ?? '', entry.value ?? '']));
    const location = entries.get('location');
    if (!location) throw new Error(`tensor ${tensor.name} lies in an external file but names none`);
    const length = entries.get('length');
    found.push({ tensor, float32: tensor.dataType === FLOAT, location, offset: Number(entries.get('offset') ?? 0), length: length === undefined ? undefined : Number(length) });
  };
  const visitGraph = (graph: proto.IGraphProto) => {
    for (const tensor of graph.initializer ?? []) visitTensor(tensor);
    for (const attr of (graph.node ?? []).flatMap((node) => node.attribute ?? [])) {
      for (const tensor of [...(attr.t ? [attr.t] : []), ...(attr.tensors ?? [])]) visitTensor(tensor);
      for (const subgraph of [...(attr.g ? [attr.g] : []), ...(attr.graphs ?? [])]) visitGraph(subgraph);
    }
  };
  if (model.graph) visitGraph(model.graph);
  return found;
}

/**
 * Writes the numbers of `tensors` (noted by externalTensors before the conversion), the float32 ones
 * that the conversion made float16 halved, one after another into `dataFile` (beside the converted
 * graph, which names it by its base name), and points the tensors there. Returns the source files read
 * (absolute), which the converted folder does not need.
 */
export async function moveExternalTensors(tensors: readonly ExternalTensor[], sourceDir: string, dataFile: string): Promise<string[]> {
  if (tensors.length === 0) return [];
  const sources = new Map<string, FileHandle>();
  const target = await open(dataFile, 'w');
  try {
    let offset = 0;
    for (const { tensor, float32, location, offset: from, length } of tensors) {
      const file = path.resolve(sourceDir, location);
      let source = sources.get(file);
      if (!source) sources.set(file, (source = await open(file)));
      const size = length ?? (await source.stat()).size - from;
      const bytes = Buffer.alloc(size);
      const { bytesRead } = await source.read(bytes, 0, size, from);
      if (bytesRead !== size) throw new Error(`${file} ends before tensor ${tensor.name} (${size} bytes from byte ${from}): the export's weights file is cut short`);
      const data = float32 && tensor.dataType === FLOAT16 ? halfBytes({ rawData: bytes }) : bytes;
      await target.write(data, 0, data.length, offset);
      tensor.externalData = [
        { key: 'location', value: path.basename(dataFile) },
        { key: 'offset', value: String(offset) },
        { key: 'length', value: String(data.length) },
      ];
      offset += data.length;
    }
  } finally {
    await Promise.all([target.close(), ...[...sources.values()].map((handle) => handle.close())]);
  }
  return [...sources.keys()];
}
