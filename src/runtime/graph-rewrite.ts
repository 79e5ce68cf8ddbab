import { open, readFile, realpath, stat } from 'node:fs/promises';
import path from 'node:path';
import onnxProto from 'onnx-proto';
import type { onnx as proto } from 'onnx-proto';
import { fileSource, lengthFields, WireFormatError, WireReader } from '../util/protobuf-wire.js';

const { onnx } = onnxProto;

/**
 * One rewrite of the ONNX graphs exporters write, made as a session loads: the zero term of attention
 * written as torch's baddbmm. diffusers' classic attention processor (which Optimum's exports of SD
 * UNets and of every SD/SDXL/FLUX VAE carry) computes the scores as `beta x zeros + alpha x Q·Kᵀ`
 * with beta 0, and the export keeps the zeros: ConstantOfShape(0) of the scores' full shape, times
 * beta, added to the scores. That is one [heads, tokens, tokens] tensor per attention layer per call
 * (1 GiB at 512x512 in SD 1.5's first block, 128 MiB in the tiny test exports', 1 GiB in a VAE
 * decoding 1024x1024), filled, multiplied and added for nothing. onnxruntime's CPU provider spent
 * 45% of a small UNet's call on it; the WebGPU provider, which has no ConstantOfShape kernel, builds
 * it on the CPU and copies it to the GPU, 600 ms of an 820 ms call on an H100 (docs/performance.md).
 * A scalar zero in its place gives the same sums bit for bit (x + 0 = x; the Mul stays, so a NaN beta
 * still makes NaN), and the same shape: baddbmm's output has the product's shape whatever its input's,
 * so the export builds the zeros in the scores' own shape (an assumption the graph cannot prove, as
 * its shapes are symbolic).
 *
 * Only that exact chain is rewritten: ConstantOfShape of float 0, times a constant, added to a product
 * of a MatMul, into a Softmax (through Casts), none of it a graph output. Graphs with subgraphs (If,
 * Loop), whose bodies may read any name, and fp16 graphs are left as exported.
 */

/** Larger graph files keep their zeros: decoding and re-encoding inline weights would cost more memory than the rewrite saves. */
const MAX_REWRITTEN_BYTES = 512 * 1024 ** 2;

/** ModelProto.graph, GraphProto.node, NodeProto.op_type. */
const MODEL_GRAPH = 7;
const GRAPH_NODE = 1;
const NODE_OP_TYPE = 4;

/** What a session is made from: the graph's file as it is, or a rewritten graph in memory whose external weights stay in `folder`. */
export type GraphSource = string | { bytes: Uint8Array; folder: string };

/** Whether any node of the graph (a file of `size` bytes) is `opType`, read from the field headers: inline weights are skipped, not read. */
async function hasOp(file: string, size: number, opType: string): Promise<boolean> {
  const handle = await open(file);
  try {
    const reader = new WireReader(fileSource(handle));
    const wanted = Buffer.from(opType);
    for await (const graph of lengthFields(reader, size, MODEL_GRAPH)) {
      for await (const node of lengthFields(reader, graph.end, GRAPH_NODE)) {
        for await (const field of lengthFields(reader, node.end, NODE_OP_TYPE)) {
          if (Buffer.from(await reader.bytes(field)).equals(wanted)) return true;
        }
      }
    }
    return false;
  } catch (err) {
    // A damaged file is onnxruntime's to report, with its own message.
    if (err instanceof WireFormatError) return false;
    throw err;
  } finally {
    await handle.close();
  }
}

/** Whether a ConstantOfShape fills with float zero. */
function fillsFloatZero(node: proto.INodeProto): boolean {
  const value = node.attribute?.find((a) => a.name === 'value')?.t;
  if (!value || value.dataType !== onnx.TensorProto.DataType.FLOAT) return false;
  const raw = value.rawData ?? new Uint8Array(0);
  const floats = value.floatData ?? [];
  return raw.length + floats.length > 0 && raw.every((b) => b === 0) && floats.every((x) => x === 0);
}

/**
 * Replaces the zero tensors of baddbmm attention (see the module's comment) with scalar zeros, in place.
 * Returns how many it replaced.
 */
export function dropAttentionZeros(graph: proto.IGraphProto): number {
  const nodes = graph.node ?? [];
  if (nodes.some((node) => node.attribute?.some((a) => a.g || a.graphs?.length))) return 0;
  const constants = new Set([...(graph.initializer ?? []).map((t) => t.name), ...nodes.filter((n) => n.opType === 'Constant').flatMap((n) => n.output ?? [])]);
  const producers = new Map(nodes.flatMap((node) => (node.output ?? []).map((output) => [output, node] as const)));
  const consumers = new Map<string, proto.INodeProto[]>();
  for (const node of nodes) {
    for (const input of node.input ?? []) {
      if (!consumers.has(input)) consumers.set(input, []);
      consumers.get(input)!.push(node);
    }
  }
  const outputs = new Set((graph.output ?? []).map((o) => o.name));
  const only = (name: string | undefined | null, opType: string) => {
    const list = consumers.get(name ?? '') ?? [];
    return list.length === 1 && list[0].opType === opType && !outputs.has(name) ? list[0] : undefined;
  };
  // The scores: Q·Kᵀ, scaled by alpha (a Mul or Div) or not.
  const isProduct = (name: string | undefined | null): boolean => {
    const node = producers.get(name ?? '');
    if (node?.opType === 'MatMul') return true;
    return (node?.opType === 'Mul' || node?.opType === 'Div') && (node.input ?? []).some((input) => producers.get(input)?.opType === 'MatMul');
  };
  // VAEs cast the scores (upcast_softmax) between the sum and the Softmax.
  const intoSoftmax = (name: string | undefined | null): boolean => {
    const cast = only(name, 'Cast');
    return cast ? intoSoftmax(cast.output?.[0]) : only(name, 'Softmax') !== undefined;
  };
  let replaced = 0;
  for (const node of nodes) {
    if (node.opType !== 'ConstantOfShape' || !fillsFloatZero(node)) continue;
    const zeros = node.output?.[0];
    const scaled = only(zeros, 'Mul');
    const beta = scaled?.input?.find((input) => input !== zeros);
    const sum = only(scaled?.output?.[0], 'Add');
    const scores = sum?.input?.find((input) => input !== scaled?.output?.[0]);
    if (!scaled || !beta || !constants.has(beta) || !sum || !isProduct(scores) || !intoSoftmax(sum.output?.[0])) continue;
    node.opType = 'Constant';
    node.input = [];
    node.attribute = [{ name: 'value', type: onnx.AttributeProto.AttributeType.TENSOR, t: { dataType: onnx.TensorProto.DataType.FLOAT, dims: [], rawData: new Uint8Array(4) } }];
    replaced++;
  }
  return replaced;
}

/**
 * The graph to make a session from: rewritten in memory where it has something to rewrite, else the
 * file itself (also when it cannot be read or decoded: onnxruntime then says what is wrong with it).
 */
export async function graphSource(file: string): Promise<GraphSource> {
  const size = (await stat(file).catch(() => undefined))?.size;
  if (size === undefined || size > MAX_REWRITTEN_BYTES || !(await hasOp(file, size, 'ConstantOfShape'))) return file;
  let model: proto.ModelProto;
  try {
    model = onnx.ModelProto.decode(await readFile(file));
  } catch {
    return file;
  }
  if (!model.graph || dropAttentionZeros(model.graph) === 0) return file;
  const folder = await weightsFolder(model.graph, path.dirname(file));
  if (!folder) return file;
  return { bytes: onnx.ModelProto.encode(model).finish(), folder };
}

/**
 * Where onnxruntime is to find the external weights of a graph made from memory, with their locations
 * made relative to it; undefined where they do not all lie in one folder. onnxruntime refuses weights
 * outside that folder once links are followed (a path-traversal guard), and Hugging Face's cache keeps
 * `model.onnx_data` as a link into its `blobs/`: so the folder is where the links lead.
 */
async function weightsFolder(graph: proto.IGraphProto, graphFolder: string): Promise<string | undefined> {
  const entries = (graph.initializer ?? []).flatMap((tensor) => (tensor.externalData ?? []).filter((entry) => entry.key === 'location'));
  if (entries.length === 0) return graphFolder;
  const real = await Promise.all(entries.map((entry) => realpath(path.join(graphFolder, entry.value ?? '')).catch(() => undefined)));
  const folders = new Set(real.map((file) => file && path.dirname(file)));
  if (folders.size !== 1 || real.includes(undefined)) return undefined;
  entries.forEach((entry, i) => (entry.value = path.basename(real[i]!)));
  return path.dirname(real[0]!);
}
