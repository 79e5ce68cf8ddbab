import { open, readFile, realpath, stat } from 'node:fs/promises';
import path from 'node:path';
import onnxProto from 'onnx-proto';
import type { onnx as proto } from 'onnx-proto';
import { fileSource, lengthFields, WireFormatError, WireReader } from '../util/protobuf-wire.js';
import { fuseAttention } from './attention-fusion.js';
import { dropAttentionZeros } from './attention-zeros.js';
import { EXECUTION_PROVIDERS, type ExecutionProvider, type GraphRewrites } from './providers.js';

const { onnx } = onnxProto;

/**
 * The rewrites of the ONNX graphs exporters write, made as a session loads: each replaces a chain that
 * exporters spell out op by op with what onnxruntime computes faster, in less memory, and with the same
 * values (bit for bit, or within what the rewrite's tests state). A graph with nothing to rewrite, or
 * that cannot be decoded, is loaded from its file as it is.
 */

/** One rewrite, applied in place to a decoded model; returns how many places it changed. */
export interface GraphRewrite {
  readonly name: string;
  /** Whether the rewritten graph gives the exported graph's values bit for bit. */
  readonly exact: boolean;
  /** The op every chain it rewrites holds: a file without one is not decoded for it. */
  readonly needs: string;
  /** The providers it was measured to help, keeping the values as its tests require. */
  readonly providers: readonly ExecutionProvider[];
  apply(model: proto.IModelProto): number;
}

/** In the order they are applied: attention fusion reads the zeros' chain as the first leaves it, or as exported. */
const GRAPH_REWRITES: readonly GraphRewrite[] = [
  { name: 'attention zeros', exact: true, needs: 'ConstantOfShape', providers: EXECUTION_PROVIDERS, apply: (model) => (model.graph ? dropAttentionZeros(model.graph) : 0) },
  // Within 1e-6 of the exported UNets' outputs (test/graph-rewrite.test.ts).
  { name: 'attention fusion', exact: false, needs: 'Softmax', providers: ['cpu'], apply: (model) => fuseAttention(model) },
];

/** The rewrites of a set. */
export const rewritesOf = (set: GraphRewrites = 'all'): readonly GraphRewrite[] => (set === 'exact' ? GRAPH_REWRITES.filter((r) => r.exact) : GRAPH_REWRITES);

/** Larger graph files load as they are: decoding and re-encoding inline weights would cost more memory than a rewrite saves. */
const MAX_REWRITTEN_BYTES = 512 * 1024 ** 2;

/** ModelProto.graph, GraphProto.node, NodeProto.op_type. */
const MODEL_GRAPH = 7;
const GRAPH_NODE = 1;
const NODE_OP_TYPE = 4;

/**
 * What a session is made from: the graph's file as it is, or a graph in memory whose external weights
 * stay in `folder`, rewritten from `file` where it was read from one (loaded instead should onnxruntime
 * refuse the rewritten graph).
 */
export type GraphSource = string | { bytes: Uint8Array; folder: string; file?: string };

/** Whether any node of the graph (a file of `size` bytes) is one of `opTypes`, read from the field headers: inline weights are skipped, not read. */
async function hasOp(file: string, size: number, opTypes: readonly string[]): Promise<boolean> {
  const handle = await open(file);
  try {
    const reader = new WireReader(fileSource(handle));
    const wanted = opTypes.map((opType) => Buffer.from(opType));
    for await (const graph of lengthFields(reader, size, MODEL_GRAPH)) {
      for await (const node of lengthFields(reader, graph.end, GRAPH_NODE)) {
        for await (const field of lengthFields(reader, node.end, NODE_OP_TYPE)) {
          const opType = Buffer.from(await reader.bytes(field));
          if (wanted.some((w) => w.equals(opType))) return true;
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

/**
 * The graph to make a session on `provider` from: rewritten in memory by those of `rewrites` made for
 * the provider where it has something to rewrite, else the file itself (also when it cannot be read or
 * decoded: onnxruntime then says what is wrong with it).
 */
export async function graphSource(file: string, provider: ExecutionProvider, rewrites: readonly GraphRewrite[] = GRAPH_REWRITES): Promise<GraphSource> {
  const chosen = rewrites.filter((rewrite) => rewrite.providers.includes(provider));
  const size = (await stat(file).catch(() => undefined))?.size;
  if (chosen.length === 0 || size === undefined || size > MAX_REWRITTEN_BYTES || !(await hasOp(file, size, chosen.map((r) => r.needs)))) return file;
  let model: proto.ModelProto;
  try {
    model = onnx.ModelProto.decode(await readFile(file));
  } catch {
    return file;
  }
  let changed: number;
  try {
    changed = chosen.reduce((sum, rewrite) => sum + rewrite.apply(model), 0);
  } catch {
    // A graph a rewrite cannot walk (a damaged one): onnxruntime says what is wrong with its file.
    return file;
  }
  if (!model.graph || changed === 0) return file;
  const folder = await weightsFolder(model.graph, path.dirname(file));
  if (!folder) return file;
  return { bytes: onnx.ModelProto.encode(model).finish(), folder, file };
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
  const found = real.filter((file) => file !== undefined);
  const folders = new Set(found.map((file) => path.dirname(file)));
  if (folders.size !== 1 || found.length < real.length) return undefined;
  entries.forEach((entry, i) => (entry.value = path.basename(found[i])));
  return [...folders][0];
}
