import onnxProto from 'onnx-proto';
import type { onnx as proto } from 'onnx-proto';
import { bufferView } from '../util/bytes.js';

/** What the graph rewrites (graph-rewrite.ts) share: lookups over one decoded graph, and its clean-up. */

const { onnx } = onnxProto;

/** Who makes and who reads each tensor of a graph, and which tensors are constants, as the graph is when indexed. */
export class GraphIndex {
  readonly producers = new Map<string, proto.INodeProto>();
  /** Who reads each tensor: a node that holds subgraphs (If, Loop, Scan) reads what their bodies read of this graph too. */
  readonly consumers = new Map<string, proto.INodeProto[]>();
  private readonly constants = new Map<string, proto.ITensorProto>();

  constructor(readonly graph: proto.IGraphProto) {
    for (const tensor of graph.initializer ?? []) if (tensor.name) this.constants.set(tensor.name, tensor);
    for (const node of graph.node ?? []) {
      for (const output of node.output ?? []) this.producers.set(output, node);
      for (const input of reads(node)) {
        if (!this.consumers.has(input)) this.consumers.set(input, []);
        this.consumers.get(input)!.push(node);
      }
      const value = node.opType === 'Constant' ? node.attribute?.find((a) => a.name === 'value')?.t : undefined;
      if (value && node.output?.[0]) this.constants.set(node.output[0], value);
    }
  }

  /** The node that makes `name` when it is `opType`. */
  producer(name: string | null | undefined, opType: string): proto.INodeProto | undefined {
    const node = this.producers.get(name ?? '');
    return node?.opType === opType ? node : undefined;
  }

  /** The only node that reads `name`, when it is `opType` and `name` is no graph output. */
  only(name: string | null | undefined, opType: string): proto.INodeProto | undefined {
    const list = this.consumers.get(name ?? '') ?? [];
    const isOutput = (this.graph.output ?? []).some((o) => o.name === name);
    return list.length === 1 && list[0].opType === opType && !isOutput ? list[0] : undefined;
  }

  /** Whether `name` is an initializer or a Constant node's output. */
  isConstant(name: string | null | undefined): boolean {
    return this.constants.has(name ?? '');
  }

  /** A constant tensor (initializer or Constant node) by name. */
  constant(name: string | null | undefined): proto.ITensorProto | undefined {
    return this.constants.get(name ?? '');
  }

  /** The numbers a constant float, int32 or int64 tensor holds; undefined for others and for non-constants. */
  values(name: string | null | undefined): number[] | undefined {
    const tensor = this.constant(name);
    return tensor && tensorValues(tensor);
  }

  /**
   * A shape tensor (the second input of a Reshape) entry by entry, each entry's number where it is a
   * constant and undefined where it is computed: a constant tensor, or a Concat of constants and
   * Unsqueezes (an Unsqueeze in a shape's Concat is one entry: the Concat's parts are 1-D, so what it
   * unsqueezed was a scalar). Undefined where its length is unknown (a Concat part such as a Slice of a
   * Shape).
   */
  shape(name: string | null | undefined): (number | undefined)[] | undefined {
    const constant = this.values(name);
    if (constant) return constant;
    const concat = this.producer(name, 'Concat');
    const parts = (concat?.input ?? []).map((part) => this.values(part) ?? (this.producer(part, 'Unsqueeze') ? [undefined] : undefined));
    return concat && !parts.includes(undefined) ? parts.flatMap((part) => part!) : undefined;
  }
}

/**
 * A tensor's numbers (float, int32 or int64), from raw bytes or the typed fields; undefined for other
 * types and for a tensor whose numbers lie in an external file.
 */
function tensorValues(tensor: proto.ITensorProto): number[] | undefined {
  if (tensor.dataLocation === onnx.TensorProto.DataLocation.EXTERNAL) return undefined;
  const raw = tensor.rawData?.length ? bufferView(tensor.rawData) : undefined;
  switch (tensor.dataType) {
    case onnx.TensorProto.DataType.FLOAT:
      return raw ? Array.from({ length: raw.length / 4 }, (_, i) => raw.readFloatLE(i * 4)) : [...(tensor.floatData ?? [])];
    case onnx.TensorProto.DataType.INT32:
      return raw ? Array.from({ length: raw.length / 4 }, (_, i) => raw.readInt32LE(i * 4)) : [...(tensor.int32Data ?? [])];
    case onnx.TensorProto.DataType.INT64:
      return raw ? Array.from({ length: raw.length / 8 }, (_, i) => Number(raw.readBigInt64LE(i * 8))) : (tensor.int64Data ?? []).map(Number);
    default:
      return undefined;
  }
}

/** Whether a ConstantOfShape or Constant fills with float zero. */
export function fillsFloatZero(node: proto.INodeProto): boolean {
  const value = node.attribute?.find((a) => a.name === 'value')?.t;
  if (!value || value.dataType !== onnx.TensorProto.DataType.FLOAT) return false;
  const values = tensorValues(value) ?? [];
  return values.length > 0 && values.every((x) => x === 0);
}

/**
 * The tensors a node reads: its inputs, and for a node that holds subgraphs (If, Loop, Scan) every name
 * their bodies (and theirs, at any depth) read from the graph around them, which ONNX lets a body read
 * without listing it as an input.
 */
function reads(node: proto.INodeProto): string[] {
  const bodies = (node.attribute ?? []).flatMap((a) => [...(a.g ? [a.g] : []), ...(a.graphs ?? [])]);
  const outer = bodies.flatMap((body) => {
    const own = new Set([...(body.input ?? []), ...(body.initializer ?? [])].map((t) => t.name));
    for (const inner of body.node ?? []) for (const output of inner.output ?? []) own.add(output);
    return (body.node ?? []).flatMap(reads).filter((name) => !own.has(name));
  });
  return [...(node.input ?? []), ...outer].filter(Boolean);
}

/**
 * Removes the nodes none of whose outputs reaches a graph output, and the initializers then read by no
 * node nor subgraph (onnxruntime would warn of each) unless the graph lists them as inputs too (as graphs before IR
 * version 4 do: removing one would make it an input to feed); returns how many nodes.
 */
export function removeUnused(graph: proto.IGraphProto): number {
  const index = new GraphIndex(graph);
  const live = new Set<proto.INodeProto>();
  const pending = (graph.output ?? []).map((o) => o.name ?? '');
  for (let name = pending.pop(); name !== undefined; name = pending.pop()) {
    const node = index.producers.get(name);
    if (!node || live.has(node)) continue;
    live.add(node);
    pending.push(...reads(node));
  }
  const before = graph.node?.length ?? 0;
  graph.node = (graph.node ?? []).filter((node) => live.has(node));
  const read = new Set([...graph.node.flatMap(reads), ...[...(graph.output ?? []), ...(graph.input ?? [])].map((o) => o.name)]);
  graph.initializer = (graph.initializer ?? []).filter((tensor) => read.has(tensor.name));
  return before - graph.node.length;
}
