import { open, stat } from 'node:fs/promises';
import path from 'node:path';
import { formatBytes } from '../util/bytes.js';
import { fileSource, lengthFields, WIRE_LENGTH, WireFormatError, WireReader, type WireField } from '../util/protobuf-wire.js';

/**
 * The external weight files an ONNX graph reads, found without loading it. Exporters save graphs over
 * 2 GB with their weights beside them under a name stored in the graph (Optimum: `model.onnx_data`,
 * ORT/Olive: `model.onnx.data`, older scripts: `weights.pb`); onnxruntime only says "file not found"
 * deep inside session creation when one was not copied. Walking the protobuf's field headers finds the
 * names and extents, reading a few bytes per initializer: an inline multi-GB graph's weights are
 * skipped by seeking, never read (src/util/protobuf-wire.ts reads the fields).
 */

/** ModelProto.graph, GraphProto.initializer, TensorProto.external_data, StringStringEntryProto key/value. */
const MODEL_GRAPH = 7;
const GRAPH_INITIALIZER = 5;
const TENSOR_EXTERNAL_DATA = 13;
const ENTRY_KEY = 1;
const ENTRY_VALUE = 2;

/** A file name or a decimal number: anything longer means the bytes are not what they seem. */
const MAX_TEXT_BYTES = 4096;

async function text(reader: WireReader, field: WireField): Promise<string> {
  if (field.end - field.start > MAX_TEXT_BYTES) throw new WireFormatError('a string too long to be a name or a number');
  return Buffer.from(await reader.bytes(field)).toString('utf8');
}

/** One external weights file of a graph. */
export interface ExternalDataFile {
  /** As the graph names it: relative to the graph's folder. */
  location: string;
  /** The end of the furthest tensor the graph reads from it: a shorter file is truncated. */
  bytesNeeded: number;
}

/** A tensor's external_data entries (location, offset, length), skipping its raw_data. */
async function externalEntries(reader: WireReader, tensorEnd: number): Promise<Map<string, string>> {
  const entries = new Map<string, string>();
  for await (const entry of lengthFields(reader, tensorEnd, TENSOR_EXTERNAL_DATA)) {
    let key = '';
    let value = '';
    for await (const part of reader.fields(entry.end)) {
      if (part.wire !== WIRE_LENGTH) continue;
      if (part.number === ENTRY_KEY) key = await text(reader, part);
      if (part.number === ENTRY_VALUE) value = await text(reader, part);
    }
    entries.set(key, value);
  }
  return entries;
}

/**
 * The external files the initializers of `onnxFile` read, and, where the walk found the file is no
 * protobuf or is cut short (a field running past its end), what is wrong: onnxruntime would refuse it
 * only when a request loads it ("Protobuf parsing failed").
 */
export async function externalDataFiles(onnxFile: string): Promise<{ files: ExternalDataFile[]; damage?: string }> {
  const needed = new Map<string, number>();
  let damage: string | undefined;
  const file = await open(onnxFile);
  try {
    const reader = new WireReader(fileSource(file));
    let graphs = 0;
    for await (const graph of lengthFields(reader, (await file.stat()).size, MODEL_GRAPH)) {
      graphs++;
      for await (const tensor of lengthFields(reader, graph.end, GRAPH_INITIALIZER)) {
        const entries = await externalEntries(reader, tensor.end);
        const location = entries.get('location');
        if (location === undefined) continue;
        const end = (Number(entries.get('offset')) || 0) + (Number(entries.get('length')) || 0);
        needed.set(location, Math.max(needed.get(location) ?? 0, end));
      }
    }
    // An empty file (a copy that failed before its first byte, a file cut short to nothing) is a valid
    // protobuf of no fields: onnxruntime refuses it ("ModelProto does not have a graph") only when a request loads it.
    if (graphs === 0) damage = 'it holds no graph';
  } catch (err) {
    if (!(err instanceof WireFormatError)) throw err;
    damage = err.message;
  } finally {
    await file.close();
  }
  return { files: [...needed].map(([location, bytesNeeded]) => ({ location, bytesNeeded })), damage };
}

/**
 * Why the graph `onnxFile` cannot load, damaged itself or for want of its external weights (paths
 * relative to the model folder `root`), or undefined when it and they are all there in full.
 */
export async function externalDataProblem(onnxFile: string, root: string): Promise<string | undefined> {
  const graph = path.relative(root, onnxFile);
  const { files, damage } = await externalDataFiles(onnxFile);
  if (damage) return `${graph} is cut short or is not an ONNX graph (${damage}): copy it again from the export`;
  const problems: string[] = [];
  for (const { location, bytesNeeded } of files) {
    const weights = path.resolve(path.dirname(onnxFile), location);
    // onnxruntime reads external weights only from the graph's own folder (and below): it would refuse
    // this graph when a request loads it, its error naming the server's folders.
    if (path.isAbsolute(location) || path.relative(path.dirname(onnxFile), weights).split(path.sep)[0] === '..') {
      problems.push(`${graph} keeps its weights in '${location}', outside its own folder, where onnxruntime does not read them: export it again with its weights beside it`);
      continue;
    }
    const name = path.relative(root, weights);
    const size = (await stat(weights).catch(() => undefined))?.size;
    if (size === undefined) {
      problems.push(`${graph} keeps its weights in ${name}, which is missing: copy it from the export too (exporters write it next to the graph, under the name the graph records)`);
    } else if (size < bytesNeeded) {
      problems.push(`${name} is truncated (${formatBytes(size)}; ${graph} reads ${formatBytes(bytesNeeded)} of it): copy it again`);
    }
  }
  return problems.length ? problems.join('; ') : undefined;
}
