import onnxProto from 'onnx-proto';
import type { onnx as proto } from 'onnx-proto';
import { fillsFloatZero, GraphIndex } from './onnx-graph.js';

/**
 * A rewrite of exported graphs (see graph-rewrite.ts): the zero term of attention written as torch's
 * baddbmm. diffusers' classic attention processor (which Optimum's exports of SD UNets and of every
 * SD/SDXL/FLUX VAE carry) computes the scores as `beta x zeros + alpha x Q·Kᵀ` with beta 0, and the
 * export keeps the zeros: ConstantOfShape(0) of the scores' full shape, times beta, added to the
 * scores. That is one [heads, tokens, tokens] tensor per attention layer per call (1 GiB at 512x512 in
 * SD 1.5's first block, 128 MiB in the tiny test exports', 1 GiB in a VAE decoding 1024x1024), filled,
 * multiplied and added for nothing. onnxruntime's CPU provider spent 45% of a small UNet's call on it;
 * the WebGPU provider, which has no ConstantOfShape kernel, builds it on the CPU and copies it to the
 * GPU, 600 ms of an 820 ms call on an H100 (docs/performance.md). A scalar zero in its place gives the
 * same sums bit for bit (x + 0 = x; the Mul stays, so a NaN beta still makes NaN), and the same shape:
 * baddbmm's output has the product's shape whatever its input's, so the export builds the zeros in the
 * scores' own shape (an assumption the graph cannot prove, as its shapes are symbolic).
 *
 * Only that exact chain is rewritten: ConstantOfShape of float 0, times a constant, added to a product
 * of a MatMul, into a Softmax (through Casts), none of it a graph output nor read by a subgraph (If,
 * Loop; the graph index counts what their bodies read). fp16 graphs are left as exported.
 */

const { onnx } = onnxProto;

/** Replaces the zero tensors of baddbmm attention with scalar zeros, in place; returns how many it replaced. */
export function dropAttentionZeros(graph: proto.IGraphProto): number {
  const index = new GraphIndex(graph);
  // The scores: Q·Kᵀ, scaled by alpha (a Mul or Div) or not.
  const isProduct = (name: string | undefined | null): boolean => {
    const node = index.producers.get(name ?? '');
    if (node?.opType === 'MatMul') return true;
    return (node?.opType === 'Mul' || node?.opType === 'Div') && (node.input ?? []).some((input) => index.producer(input, 'MatMul'));
  };
  // VAEs cast the scores (upcast_softmax) between the sum and the Softmax.
  const intoSoftmax = (name: string | undefined | null): boolean => {
    const cast = index.only(name, 'Cast');
    return cast ? intoSoftmax(cast.output?.[0]) : index.only(name, 'Softmax') !== undefined;
  };
  let replaced = 0;
  for (const node of graph.node ?? []) {
    if (node.opType !== 'ConstantOfShape' || !fillsFloatZero(node)) continue;
    const zeros = node.output?.[0];
    const scaled = index.only(zeros, 'Mul');
    const beta = scaled?.input?.find((input) => input !== zeros);
    const sum = index.only(scaled?.output?.[0], 'Add');
    const scores = sum?.input?.find((input) => input !== scaled?.output?.[0]);
    if (!scaled || !index.isConstant(beta) || !sum || !isProduct(scores) || !intoSoftmax(sum.output?.[0])) continue;
    node.opType = 'Constant';
    node.input = [];
    node.attribute = [{ name: 'value', type: onnx.AttributeProto.AttributeType.TENSOR, t: { dataType: onnx.TensorProto.DataType.FLOAT, dims: [], rawData: new Uint8Array(4) } }];
    replaced++;
  }
  return replaced;
}
