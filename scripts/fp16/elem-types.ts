/**
 * The element type of every value in an ONNX graph, the part of ONNX shape inference the float16
 * converter needs: which values are float32, so that it knows where to put Casts around the nodes
 * that stay float32. Exporters rarely write value_info (Optimum writes none), so it is inferred from
 * the graph inputs, initializers and the handful of ops whose output type is not their first input's.
 * A sequence value is recorded by the element type of its tensors.
 */
import onnxProto from 'onnx-proto';
import type { onnx as proto } from 'onnx-proto';

const { onnx } = onnxProto;
const DataType = onnx.TensorProto.DataType;

export type ElemTypes = Map<string, number>;

/** Ops whose outputs are integers or booleans whatever their inputs. */
const FIXED_OUTPUT: Record<string, number> = {
  Shape: DataType.INT64,
  Size: DataType.INT64,
  NonZero: DataType.INT64,
  ArgMax: DataType.INT64,
  ArgMin: DataType.INT64,
  Equal: DataType.BOOL,
  Less: DataType.BOOL,
  LessOrEqual: DataType.BOOL,
  Greater: DataType.BOOL,
  GreaterOrEqual: DataType.BOOL,
  Not: DataType.BOOL,
  And: DataType.BOOL,
  Or: DataType.BOOL,
  Xor: DataType.BOOL,
  IsNaN: DataType.BOOL,
  IsInf: DataType.BOOL,
};

export function attribute(node: proto.INodeProto, name: string): proto.IAttributeProto | undefined {
  return node.attribute?.find((a) => a.name === name);
}

function typeOfValueInfo(info: proto.IValueInfoProto): number | undefined {
  const type = info.type;
  return type?.tensorType?.elemType ?? type?.sequenceType?.elemType?.tensorType?.elemType ?? undefined;
}

function constantType(node: proto.INodeProto): number {
  const value = attribute(node, 'value')?.t;
  if (value) return value.dataType ?? DataType.FLOAT;
  if (attribute(node, 'value_float') || attribute(node, 'value_floats')) return DataType.FLOAT;
  if (attribute(node, 'value_int') || attribute(node, 'value_ints')) return DataType.INT64;
  throw new Error(`Constant ${node.name}: no dtype rule for its value attribute`);
}

/** The element types of a node's outputs, given those of its inputs (`types`). */
function outputTypes(node: proto.INodeProto, types: ElemTypes): (number | undefined)[] {
  const op = node.opType ?? '';
  const inputs = node.input ?? [];
  const outputs = node.output ?? [];
  const typeOf = (i: number) => (inputs[i] ? types.get(inputs[i]) : undefined);
  if (op in FIXED_OUTPUT) return outputs.map(() => FIXED_OUTPUT[op]);
  switch (op) {
    case 'Constant':
      return [constantType(node)];
    case 'Cast':
      return [Number(attribute(node, 'to')?.i)];
    case 'CastLike':
      return [typeOf(1)];
    // ONNX's defaults: a float32 zero, a sequence of float32 tensors.
    case 'ConstantOfShape':
      return [attribute(node, 'value')?.t?.dataType ?? DataType.FLOAT];
    case 'SequenceEmpty':
      return [Number(attribute(node, 'dtype')?.i ?? DataType.FLOAT)];
    case 'Where':
      return [typeOf(1)];
    // Loop-carried values keep their initial type; the scan outputs are the body's.
    case 'Loop': {
      const body = attribute(node, 'body')?.g;
      const carried = inputs.length - 2;
      return outputs.map((_, i) => (i < carried ? typeOf(i + 2) : body?.output?.[1 + i] && typeOfValueInfo(body.output[1 + i])));
    }
  }
  if (inputs.length === 0) throw new Error(`${op} ${node.name}: no dtype rule for an op without inputs`);
  // Everything else computes in (and returns) the type of its first input: arithmetic, MatMul, Conv,
  // normalisations, Reshape/Transpose/Gather/Slice/Concat/Split, Range, Resize, Pad, the Sequence ops.
  return outputs.map(() => typeOf(0));
}

/** Element types of every value of `graph` (and of its subgraphs), seeing the enclosing scope's `outer`. */
export function inferElemTypes(graph: proto.IGraphProto, outer: ReadonlyMap<string, number> = new Map()): ElemTypes {
  const types: ElemTypes = new Map(outer);
  for (const info of [...(graph.input ?? []), ...(graph.valueInfo ?? [])]) {
    const type = typeOfValueInfo(info);
    if (info.name && type !== undefined) types.set(info.name, type);
  }
  for (const init of graph.initializer ?? []) if (init.name) types.set(init.name, init.dataType ?? DataType.UNDEFINED);
  for (const node of graph.node ?? []) {
    for (const attr of node.attribute ?? []) {
      if (attr.g) for (const [name, type] of inferElemTypes(attr.g, types)) types.set(name, type);
    }
    const out = outputTypes(node, types);
    (node.output ?? []).forEach((name, i) => {
      const type = out[i];
      if (name && type !== undefined) types.set(name, type);
    });
  }
  return types;
}
