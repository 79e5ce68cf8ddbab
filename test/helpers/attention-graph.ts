import onnxProto from 'onnx-proto';
import type { onnx as proto } from 'onnx-proto';

/**
 * Hand-made ONNX graphs of the attention that src/runtime/graph-rewrite.ts rewrites, for the rewrite's
 * tests and for measuring a rewritten graph's load (rewritten-load.ts).
 */

const { onnx } = onnxProto;

/** A node of a hand-made graph: op type, inputs, outputs. */
export const node = (opType: string, input: string[], output: string[], attribute: proto.IAttributeProto[] = []): proto.INodeProto => ({ opType, input, output, attribute });
const fill = (value: number): proto.IAttributeProto => ({ name: 'value', type: onnx.AttributeProto.AttributeType.TENSOR, t: { dataType: onnx.TensorProto.DataType.FLOAT, dims: [1], rawData: new Uint8Array(new Float32Array([value]).buffer) } });

/** Attention scores as torch's baddbmm exports them: alpha x Q·Kᵀ + beta x zeros, into `last` (Softmax, or something else). */
export function baddbmmGraph({ zero = 0, betaIsConstant = true, scoresOp = 'MatMul', between = [] as string[], last = 'Softmax', outputs = ['probs'] } = {}): proto.IGraphProto {
  const chain = ['sum', ...between.map((_, i) => `cast${i}`)];
  return {
    initializer: [{ name: 'beta', dataType: onnx.TensorProto.DataType.FLOAT, dims: [], rawData: new Uint8Array(4) }],
    output: outputs.map((name) => ({ name })),
    node: [
      node(scoresOp, ['q', 'k'], ['qk']),
      node('Mul', ['qk', 'alpha'], ['scores']),
      node('Shape', ['scores'], ['shape']),
      node('ConstantOfShape', ['shape'], ['zeros'], [fill(zero)]),
      node('Mul', ['zeros', betaIsConstant ? 'beta' : 'scores'], ['scaled']),
      node('Add', ['scores', 'scaled'], ['sum']),
      ...between.map((op, i) => node(op, [chain[i]], [chain[i + 1]])),
      node(last, [chain.at(-1)!], ['probs']),
    ],
  };
}
