/**
 * float32 -> float16 conversion of an ONNX model, in the spirit of onnxconverter-common's
 * `convert_float_to_float16`: float32 initializers, Constant and ConstantOfShape values, graph inputs,
 * outputs and value_info, Cast(to=FLOAT) and SequenceEmpty(dtype=FLOAT) become float16, in subgraphs
 * too. Nodes whose op is on the block list keep computing in float32 between Casts (its
 * `op_block_list`). Integer values (ids, shapes, int64 timesteps) are left as they are.
 */
import onnxProto from 'onnx-proto';
import type { onnx as proto } from 'onnx-proto';
import { toHalfBits } from '../../src/runtime/float16.js';
import { attribute, inferElemTypes, type ElemTypes } from './elem-types.js';

const { onnx } = onnxProto;
const { FLOAT, FLOAT16 } = onnx.TensorProto.DataType;
const AttributeType = onnx.AttributeProto.AttributeType;

/** Largest finite float16. */
const HALF_MAX = 65504;

/**
 * Inputs that ONNX types as float32 whatever the op's T: Resize's `scales`. A float16 value there is
 * cast back to float32.
 */
const ALWAYS_FLOAT_INPUTS: Record<string, readonly number[]> = { Resize: [2] };

export interface Float16Options {
  /**
   * Op types that keep computing in float32, between Casts. None are needed for onnxruntime's CPU
   * provider: at load its InsertCastTransformer wraps every node that has no float16 CPU kernel
   * (in onnxruntime 1.30 on x86-64: Conv, MatMul, Gemm, the element-wise arithmetic and functions,
   * InstanceNormalization; only data movement such as Reshape/Transpose/Concat/Slice/Gather runs on
   * float16 data) in Casts of its own. Blocking is for graphs meant for providers that do compute
   * in float16, to keep overflow-prone ops in float32.
   */
  blockList?: ReadonlySet<string>;
}

/** Rounds to float16 bits; finite values beyond its range saturate (see halfBytes). */
function halfBitsSaturating(x: number): number {
  return toHalfBits(Number.isFinite(x) ? Math.max(-HALF_MAX, Math.min(HALF_MAX, x)) : x);
}

/**
 * A float32 tensor's values as float16 raw data (little-endian, as ONNX requires). Finite values
 * beyond float16's range, such as attention masks filled with float32's lowest, saturate instead of
 * becoming infinities, which would turn `mask * 0` into NaN.
 */
export function halfBytes(tensor: Pick<proto.ITensorProto, 'rawData' | 'floatData'>): Uint8Array {
  const raw = tensor.rawData ?? new Uint8Array(0);
  const floats = tensor.floatData ?? [];
  const count = raw.byteLength > 0 ? raw.byteLength / 4 : floats.length;
  const source = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
  const bytes = new Uint8Array(count * 2);
  const out = new DataView(bytes.buffer);
  for (let i = 0; i < count; i++) {
    const x = raw.byteLength > 0 ? source.getFloat32(i * 4, true) : floats[i];
    out.setUint16(i * 2, halfBitsSaturating(x), true);
  }
  return bytes;
}

/** Whether a tensor's numbers lie in a file beside the graph rather than in it. */
export function isExternal(tensor: proto.ITensorProto): boolean {
  return tensor.dataLocation === onnx.TensorProto.DataLocation.EXTERNAL || (tensor.externalData?.length ?? 0) > 0;
}

/**
 * Rewrites a float32 tensor as float16 in place; other tensors are left alone. An external one is
 * only retyped: its numbers are converted where they lie, by external-data.ts.
 */
function toHalfTensor(tensor: proto.ITensorProto): void {
  if (tensor.dataType !== FLOAT) return;
  tensor.dataType = FLOAT16;
  if (isExternal(tensor)) return;
  tensor.rawData = halfBytes(tensor);
  tensor.floatData = [];
}

function toHalfType(type: proto.ITypeProto | null | undefined): void {
  if (!type) return;
  if (type.tensorType?.elemType === FLOAT) type.tensorType.elemType = FLOAT16;
  toHalfType(type.sequenceType?.elemType);
  toHalfType(type.optionalType?.elemType);
}

function castNode(name: string, input: string, output: string, to: number): proto.INodeProto {
  return { name, opType: 'Cast', input: [input], output: [output], attribute: [{ name: 'to', type: AttributeType.INT, i: to }] };
}

/** A converted node's attributes: float32 constants, target types and subgraphs become float16. */
function convertAttributes(node: proto.INodeProto, types: ElemTypes, options: Float16Options): void {
  const op = node.opType;
  for (const attr of node.attribute ?? []) {
    if (attr.t) toHalfTensor(attr.t);
    if (attr.g) convertGraph(attr.g, types, options);
    if ((op === 'Cast' && attr.name === 'to') || (op === 'SequenceEmpty' && attr.name === 'dtype')) {
      if (Number(attr.i) === FLOAT) attr.i = FLOAT16;
    }
  }
  // Left out, these attributes default to float32: spell out float16 instead.
  if (op === 'SequenceEmpty' && !attribute(node, 'dtype')) node.attribute = [...(node.attribute ?? []), { name: 'dtype', type: AttributeType.INT, i: FLOAT16 }];
  if (op === 'ConstantOfShape' && !attribute(node, 'value')) {
    node.attribute = [...(node.attribute ?? []), { name: 'value', type: AttributeType.TENSOR, t: { dims: [1], dataType: FLOAT16, rawData: new Uint8Array(2) } }];
  }
  const scalar = attribute(node, 'value_float') ?? attribute(node, 'value_floats');
  if (op === 'Constant' && scalar) {
    const floats = scalar.name === 'value_float' ? [scalar.f ?? 0] : (scalar.floats ?? []);
    const t: proto.ITensorProto = { dims: scalar.name === 'value_float' ? [] : [floats.length], dataType: FLOAT, floatData: floats };
    toHalfTensor(t);
    node.attribute = [{ name: 'value', type: AttributeType.TENSOR, t }];
  }
}

/**
 * Converts `graph` in place. Values that were float32 are float16 afterwards under the same names;
 * a blocked node reads float32 copies of its float inputs and writes float32 outputs that are cast
 * back under the original names, so every other node sees float16.
 */
function convertGraph(graph: proto.IGraphProto, outer: ReadonlyMap<string, number>, options: Float16Options): void {
  const types = inferElemTypes(graph, outer);
  const isFloat = (name: string) => name !== '' && types.get(name) === FLOAT;
  for (const init of graph.initializer ?? []) toHalfTensor(init);
  for (const info of [...(graph.input ?? []), ...(graph.output ?? []), ...(graph.valueInfo ?? [])]) toHalfType(info.type);

  const nodes: proto.INodeProto[] = [];
  /** float32 copies already made of float16 values, by value name. */
  const float32Copies = new Map<string, string>();
  const float32Copy = (name: string): string => {
    let copy = float32Copies.get(name);
    if (!copy) {
      copy = `${name}_fp32`;
      nodes.push(castNode(`${name}_to_fp32`, name, copy, FLOAT));
      float32Copies.set(name, copy);
    }
    return copy;
  };
  for (const node of graph.node ?? []) {
    const inputs = node.input ?? [];
    if (options.blockList?.has(node.opType ?? '')) {
      // Its subgraphs would read float16 values of the enclosing graph that they declare as float32.
      if (node.attribute?.some((a) => a.g)) throw new Error(`${node.opType} ${node.name}: ops with subgraphs cannot stay float32`);
      node.input = inputs.map((name) => (isFloat(name) ? float32Copy(name) : name));
      const restore: proto.INodeProto[] = [];
      node.output = (node.output ?? []).map((name) => {
        if (!isFloat(name)) return name;
        const copy = `${name}_fp32`;
        restore.push(castNode(`${name}_to_fp16`, copy, name, FLOAT16));
        // A blocked consumer of this output reads the float32 original, not a round trip through float16.
        float32Copies.set(name, copy);
        return copy;
      });
      nodes.push(node, ...restore);
      continue;
    }
    if (node.opType === 'Cast' && isFloat(inputs[0]) && Number(attribute(node, 'to')?.i) === FLOAT) {
      // A float32 -> float32 Cast (diffusers' `.to(dtype)` after a softmax) would become float16 ->
      // float16, which onnxruntime 1.30 rejects at load with graph optimisations disabled (its
      // InsertCastTransformer retypes the Cast's output). It never changed a value: an Identity.
      nodes.push({ name: node.name, opType: 'Identity', input: [inputs[0]], output: node.output });
      continue;
    }
    const alwaysFloat = ALWAYS_FLOAT_INPUTS[node.opType ?? ''] ?? [];
    node.input = inputs.map((name, i) => (alwaysFloat.includes(i) && isFloat(name) ? float32Copy(name) : name));
    convertAttributes(node, types, options);
    nodes.push(node);
  }
  graph.node = nodes;
}

/**
 * Converts a decoded model in place, as the module comment says. Tensors whose numbers lie in external
 * files are retyped only: convert-folder.ts has external-data.ts convert their numbers in their files.
 */
export function convertModelToFloat16(model: proto.IModelProto, options: Float16Options = {}): void {
  if (!model.graph) throw new Error('the model has no graph');
  convertGraph(model.graph, new Map(), options);
}

/** An ONNX model file's bytes, converted as the module comment says; its weights must lie inside it. */
export function convertOnnxBytesToFloat16(bytes: Uint8Array, options: Float16Options = {}): Uint8Array {
  const model = onnx.ModelProto.decode(bytes);
  const external = (model.graph?.initializer ?? []).find(isExternal);
  if (external) throw new Error(`initializer ${external.name} lies in an external file: convert the model's folder (convertFolderToFloat16), which converts it there`);
  convertModelToFloat16(model, options);
  return onnx.ModelProto.encode(model).finish();
}
