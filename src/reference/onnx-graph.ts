/**
 * A small ONNX graph builder over onnx-proto, just enough for the reference models.
 *
 * Output is byte-for-byte deterministic: no timestamps or random names, nodes and initializers are
 * written in the order they were added, and value names come from a per-graph counter.
 */
import onnxProto from 'onnx-proto';
import type { onnx as proto } from 'onnx-proto';

const { onnx } = onnxProto;

export type DType = 'float32' | 'float16' | 'int32' | 'int64';
/** A fixed size or a symbolic (dynamic) dimension name such as "batch". */
export type Dim = number | string;
/** Integers become INT(S) attributes, strings STRING; wrap a number in `{ float }` for FLOAT. */
export type AttrValue = number | number[] | string | { float: number };

/** opset 17 / IR 8: supported by every onnxruntime release the project targets. */
const OPSET = 17;
const IR_VERSION = 8;
/** Like onnx.save_model(size_threshold=1024): smaller initializers stay inside model.onnx. */
const EXTERNAL_THRESHOLD_BYTES = 1024;

const ELEM_TYPE: Record<DType, number> = {
  float32: onnx.TensorProto.DataType.FLOAT,
  float16: onnx.TensorProto.DataType.FLOAT16,
  int32: onnx.TensorProto.DataType.INT32,
  int64: onnx.TensorProto.DataType.INT64,
};

export interface EncodedModel {
  model: Uint8Array;
  /** The external weights file, when the model was encoded with one and had large initializers. */
  externalData?: Uint8Array;
}

interface Initializer {
  name: string;
  dtype: 'float32' | 'int64';
  dims: number[];
  bytes: Uint8Array;
}

/** Little-endian bytes, as ONNX raw_data requires whatever the host's byte order. */
function rawBytes(dtype: 'float32' | 'int64', values: ArrayLike<number>): Uint8Array {
  const width = dtype === 'float32' ? 4 : 8;
  const view = new DataView(new ArrayBuffer(values.length * width));
  for (let i = 0; i < values.length; i++) {
    if (dtype === 'float32') view.setFloat32(i * 4, values[i], true);
    else view.setBigInt64(i * 8, BigInt(values[i]), true);
  }
  return new Uint8Array(view.buffer);
}

function valueInfo(name: string, dtype: DType, dims: readonly Dim[]): proto.IValueInfoProto {
  return {
    name,
    type: {
      tensorType: {
        elemType: ELEM_TYPE[dtype],
        shape: { dim: dims.map((d) => (typeof d === 'number' ? { dimValue: d } : { dimParam: d })) },
      },
    },
  };
}

function attribute(name: string, value: AttrValue): proto.IAttributeProto {
  const T = onnx.AttributeProto.AttributeType;
  if (typeof value === 'string') return { name, type: T.STRING, s: new TextEncoder().encode(value) };
  if (Array.isArray(value)) return { name, type: T.INTS, ints: value };
  if (typeof value === 'object') return { name, type: T.FLOAT, f: value.float };
  if (!Number.isInteger(value)) throw new Error(`attribute ${name}: wrap float values as { float }`);
  return { name, type: T.INT, i: value };
}

export class Graph {
  private readonly nodes: proto.INodeProto[] = [];
  private readonly inputs: proto.IValueInfoProto[] = [];
  private readonly outputs: proto.IValueInfoProto[] = [];
  private readonly initializers: Initializer[] = [];
  private counter = 0;

  constructor(private readonly name: string) {}

  private fresh(prefix: string): string {
    return `${prefix}_${this.counter++}`;
  }

  /**
   * Declares a graph input and returns the value to compute with: float16 inputs are cast to float32
   * right away, because every reference graph computes in float32 (a float16 softmax over large
   * logits would overflow).
   */
  input(name: string, dtype: DType, dims: readonly Dim[]): string {
    this.inputs.push(valueInfo(name, dtype, dims));
    return dtype === 'float16' ? this.cast(name, 'float32') : name;
  }

  /** Declares a graph output fed from a float32 (or integer) value, casting to float16 if asked. */
  output(name: string, value: string, dtype: DType, dims: readonly Dim[]): void {
    if (dtype === 'float16') this.node('Cast', [value], [name], { to: ELEM_TYPE.float16 });
    else this.node('Identity', [value], [name]);
    this.outputs.push(valueInfo(name, dtype, dims));
  }

  /** A named weight tensor. Large ones go to the external data file when the model has one. */
  initializer(name: string, dtype: 'float32' | 'int64', dims: number[], values: ArrayLike<number>): string {
    const count = dims.reduce((a, b) => a * b, 1);
    if (count !== values.length) throw new Error(`initializer ${name}: ${values.length} values for dims ${dims}`);
    this.initializers.push({ name, dtype, dims, bytes: rawBytes(dtype, values) });
    return name;
  }

  /** An anonymous float32 constant: a scalar, or 1-D from an array. */
  floats(values: number | number[]): string {
    return typeof values === 'number'
      ? this.initializer(this.fresh('const'), 'float32', [], [values])
      : this.initializer(this.fresh('const'), 'float32', [values.length], values);
  }

  /** An anonymous 1-D int64 constant: shapes, axes, indices. */
  ints(values: number[]): string {
    return this.initializer(this.fresh('const'), 'int64', [values.length], values);
  }

  cast(value: string, dtype: DType): string {
    return this.op('Cast', [value], { to: ELEM_TYPE[dtype] });
  }

  /** Adds a node with one output and returns that output's name. */
  op(opType: string, inputs: string[], attrs: Record<string, AttrValue> = {}): string {
    const out = this.fresh(opType.toLowerCase());
    this.node(opType, inputs, [out], attrs);
    return out;
  }

  private node(opType: string, inputs: string[], outputs: string[], attrs: Record<string, AttrValue> = {}): void {
    this.nodes.push({
      name: this.fresh(opType),
      opType,
      input: inputs,
      output: outputs,
      attribute: Object.entries(attrs).map(([k, v]) => attribute(k, v)),
    });
  }

  /**
   * Serialises the model. With `externalDataFile`, initializers of 1 KiB or more are appended to that
   * file (relative to model.onnx) and referenced by location/offset/length, as real exports do.
   */
  encode(externalDataFile?: string): EncodedModel {
    const chunks: Uint8Array[] = [];
    let offset = 0;
    const initializer = this.initializers.map((init): proto.ITensorProto => {
      const base = { name: init.name, dataType: ELEM_TYPE[init.dtype], dims: init.dims };
      if (!externalDataFile || init.bytes.length < EXTERNAL_THRESHOLD_BYTES) return { ...base, rawData: init.bytes };
      const entry: proto.ITensorProto = {
        ...base,
        dataLocation: onnx.TensorProto.DataLocation.EXTERNAL,
        externalData: [
          { key: 'location', value: externalDataFile },
          { key: 'offset', value: String(offset) },
          { key: 'length', value: String(init.bytes.length) },
        ],
      };
      chunks.push(init.bytes);
      offset += init.bytes.length;
      return entry;
    });
    const model = onnx.ModelProto.encode({
      irVersion: IR_VERSION,
      opsetImport: [{ domain: '', version: OPSET }],
      producerName: 'imagegen-reference',
      graph: { name: this.name, node: this.nodes, input: this.inputs, output: this.outputs, initializer },
    }).finish();
    if (chunks.length === 0) return { model };
    const externalData = new Uint8Array(offset);
    let at = 0;
    for (const chunk of chunks) {
      externalData.set(chunk, at);
      at += chunk.length;
    }
    return { model, externalData };
  }
}
