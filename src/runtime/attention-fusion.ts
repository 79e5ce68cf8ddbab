import onnxProto from 'onnx-proto';
import type { onnx as proto } from 'onnx-proto';
import { fillsFloatZero, GraphIndex, hasSubgraphs, removeUnused } from './onnx-graph.js';

/**
 * A rewrite of exported graphs (see graph-rewrite.ts): diffusers' classic attention, as Optimum's
 * exports of SD and SDXL UNets carry it, made one com.microsoft.MultiHeadAttention node. As exported,
 * each attention layer folds its heads into the batch (Reshape to [B,T,H,D], Transpose, Reshape to
 * [B·H,T,D]), multiplies Q by Kᵀ into a [B·H,T,S] tensor of scores, scales it, takes its Softmax,
 * multiplies by V and unfolds the heads again: at 512x512 SD 1.5's first blocks hold 1 GiB of scores
 * per call for that. onnxruntime's CPU kernel of MultiHeadAttention computes the same thing in blocks
 * (flash attention) without ever holding the scores: on this project's 2-core machine the SD 1.5 test
 * export's UNet call at 768x768 took x0.66 the time and peaked at 264 MiB instead of 2965, its output
 * within 3e-6 of the unfused graph's (docs/performance.md, `npm run bench:graph-rewrite`).
 *
 * Fusion pays for heads of 40 to 256 (x0.75 to x0.88 per layer with its projections) but not for the
 * 512 of the VAEs' single-headed attention (x1.27; the tiled decode bounds its memory instead), so only
 * heads of up to MAX_HEAD_SIZE are fused. Only the CPU provider gets this graph (graph-rewrite.ts):
 * the WebGPU provider's kernel differed from the exported chain by 1.5e-3 on lavapipe, and the CUDA
 * provider's could not be measured here.
 *
 * Only the exact chain is fused, every link checked: Q, K and V each folded as above with the same
 * constant head count at the folded shape's entry 2; Q·Kᵀ (Kᵀ a Transpose of the last two axes) scaled
 * by a constant (Mul or Div) or not, plus nothing but a constant-zero term (baddbmm's, see
 * attention-zeros.ts), Softmax on the last axis, Casts to float only, times V, unfolded by a Reshape to
 * [B,H,T,D] (the same constant H at entry 1), a Transpose(0,2,1,3) and a Reshape. The unfolded
 * output's Reshape becomes the fused node, so every reader of that output reads the same values, and
 * the links then read by nothing are removed; a link that something else also reads (the Shapes that
 * compute the folds' sizes, a graph output) stays, as does all of a chain any link of which fails a
 * check. Q, K and V must be float32 projections (MatMul by a float initializer, plus a bias or not),
 * which also gives the head size. Every Reshape's shape must have the rank of its place in the chain,
 * and its constant entries the sizes of their axes (a computed entry is onnxruntime's to check, as it
 * does when the exported graph runs). Graphs with subgraphs are left as exported.
 */

const { onnx } = onnxProto;

/** Widest head fused (see the module's comment). */
export const MAX_HEAD_SIZE = 256;

/** The opset that holds MultiHeadAttention. */
const MICROSOFT_DOMAIN = 'com.microsoft';

/** One attention layer found as exported: its inputs, head count and scale, and the node that gives its unfolded output. */
interface ExportedAttention {
  query: string;
  key: string;
  value: string;
  heads: number;
  scale: number;
  /** The last Reshape of the chain, whose output is the layer's [B,T,H·D]. */
  output: proto.INodeProto;
}

const sameInts = (attribute: proto.IAttributeProto | undefined, ints: number[]) =>
  attribute !== undefined && attribute.ints?.length === ints.length && attribute.ints.every((v, i) => Number(v) === ints[i]);

/** The chain's checks, over one indexed graph. */
class Matcher {
  constructor(
    private readonly index: GraphIndex,
    private readonly opset: number,
    private readonly maxHeadSize: number,
  ) {}

  private perm(node: proto.INodeProto | undefined, ints: number[]): boolean {
    return sameInts(node?.attribute?.find((a) => a.name === 'perm'), ints);
  }

  /** The one node of `opType` that reads `name` (other nodes may read it too: they keep it). */
  private reader(name: string | null | undefined, opType: string): proto.INodeProto | undefined {
    const readers = (this.index.consumers.get(name ?? '') ?? []).filter((node) => node.opType === opType);
    return readers.length === 1 ? readers[0] : undefined;
  }

  /** `name` past any Casts to float, going back (`up`) or forward through their readers. */
  private throughCasts(name: string, up: boolean): string {
    // A damaged graph may cast in a loop: onnxruntime reports it, this must not spin on it.
    const seen = new Set<string>();
    while (!seen.has(name)) {
      seen.add(name);
      const cast = up ? this.index.producer(name, 'Cast') : this.reader(name, 'Cast');
      const to = cast?.attribute?.find((a) => a.name === 'to')?.i;
      if (!cast || Number(to) !== onnx.TensorProto.DataType.FLOAT) return name;
      name = (up ? cast.input?.[0] : cast.output?.[0]) ?? '';
    }
    return name;
  }

  /**
   * Whether a Reshape's target shape has the entries of `expected`, one per axis: a number is that
   * size ('D', the head size, known once the widths are), 'same' the input's own size at that axis
   * (0 copies it), 'any' a size of the batch or tokens. An entry computed from sizes at run time can
   * only be checked by onnxruntime, so it passes, as does -1 (one at most: the size that makes the
   * count of values right) and a positive constant in place of 'same' or 'any'.
   */
  private reshapesTo(reshape: proto.INodeProto, expected: readonly (number | 'same' | 'any')[]): boolean {
    const shape = this.index.shape(reshape.input?.[1]);
    if (!shape || shape.length !== expected.length || shape.filter((entry) => entry === -1).length > 1) return false;
    return shape.every((entry, i) => {
      const wanted = expected[i];
      if (entry === undefined || entry === -1) return true;
      if (typeof wanted === 'number') return entry === wanted;
      return entry > 0 || (entry === 0 && wanted === 'same');
    });
  }

  /** Heads folded into the batch: [B,T,H·D] -> Reshape [B,T,H,D] -> Transpose(0,2,1,3) -> Reshape [B·H,T,D]. */
  private folded(name: string | null | undefined): { source: string; heads: number; split: proto.INodeProto; merge: proto.INodeProto } | undefined {
    const merge = this.index.producer(name, 'Reshape');
    const transpose = this.index.producer(merge?.input?.[0], 'Transpose');
    const split = this.index.producer(transpose?.input?.[0], 'Reshape');
    const heads = this.index.shape(split?.input?.[1])?.[2];
    if (!merge || !split?.input?.[0] || !this.perm(transpose, [0, 2, 1, 3]) || !heads || heads < 1) return undefined;
    return { source: split.input[0], heads, split, merge };
  }

  /** The width of a float32 projection (MatMul by an initializer [in, out], plus a bias or not). */
  private width(name: string): number | undefined {
    const bias = this.index.producer(name, 'Add');
    const matmul = this.index.producer(name, 'MatMul') ?? bias?.input?.map((input) => this.index.producer(input, 'MatMul')).find(Boolean);
    const weights = this.index.constant(matmul?.input?.[1]);
    const dims = weights?.dims?.map(Number) ?? [];
    return weights?.dataType === onnx.TensorProto.DataType.FLOAT && dims.length === 2 ? dims[1] : undefined;
  }

  /** The scores' scale and the Q·Kᵀ MatMul under them, past baddbmm's zero term where there is one. */
  private scaled(name: string): { scale: number; product: proto.INodeProto } | undefined {
    const sum = this.index.producer(name, 'Add');
    if (sum) {
      const zeroTerm = (input: string) => {
        const mul = this.index.producer(input, 'Mul');
        const zero = mul?.input?.map((i) => this.index.producers.get(i)).find((n) => n && (n.opType === 'Constant' || n.opType === 'ConstantOfShape') && fillsFloatZero(n));
        // The other factor one finite number: an infinite or NaN beta makes NaN of the sum, a wider one broadcasts it.
        const factors = (mul?.input ?? []).filter((i) => this.index.producers.get(i) !== zero).map((i) => this.index.values(i));
        return zero !== undefined && factors.length === 1 && factors[0]?.length === 1 && Number.isFinite(factors[0][0]);
      };
      const inputs = sum.input ?? [];
      const other = inputs.length === 2 ? inputs.find((input) => !zeroTerm(input)) : undefined;
      if (other === undefined || inputs.filter((input) => zeroTerm(input)).length !== 1) return undefined;
      name = other;
    }
    const scaling = this.index.producer(name, 'Mul') ?? this.index.producer(name, 'Div');
    if (!scaling) {
      const product = this.index.producer(name, 'MatMul');
      return product && { scale: 1, product };
    }
    const [a, b] = scaling.input ?? [];
    const factor = this.index.values(b);
    const product = this.index.producer(a, 'MatMul');
    if (!product || factor?.length !== 1 || !Number.isFinite(factor[0]) || factor[0] === 0) return undefined;
    return { scale: scaling.opType === 'Mul' ? factor[0] : 1 / factor[0], product };
  }

  /** The attention layer whose Softmax this is, when every link of its chain passes. */
  match(softmax: proto.INodeProto): ExportedAttention | undefined {
    const axis = softmax.attribute?.find((a) => a.name === 'axis');
    // Before opset 13 Softmax flattened its input from the axis on: another operation.
    const lastAxis = axis ? Number(axis.i) === -1 || Number(axis.i) === 2 : this.opset >= 13;
    const scores = this.scaled(this.throughCasts(softmax.input?.[0] ?? '', true));
    if (!lastAxis || !scores) return undefined;
    const [queryFolded, keyTransposed] = scores.product.input ?? [];
    const transpose = this.index.producer(keyTransposed, 'Transpose');
    if (!this.perm(transpose, [0, 2, 1])) return undefined;
    const query = this.folded(queryFolded);
    const key = this.folded(transpose?.input?.[0]);

    const probabilities = this.throughCasts(softmax.output?.[0] ?? '', false);
    const weighted = this.reader(probabilities, 'MatMul');
    if (!weighted || weighted.input?.[0] !== probabilities) return undefined;
    const value = this.folded(weighted.input?.[1]);
    const split = this.reader(weighted.output?.[0], 'Reshape');
    const transposeBack = this.reader(split?.output?.[0], 'Transpose');
    const merge = this.reader(transposeBack?.output?.[0], 'Reshape');
    if (!query || !key || !value || !split || !merge || !this.perm(transposeBack, [0, 2, 1, 3])) return undefined;

    const heads = query.heads;
    const width = this.width(query.source);
    const widths = [key, value].map((v) => this.width(v.source));
    if (key.heads !== heads || value.heads !== heads) return undefined;
    if (!width || width % heads !== 0 || width / heads > this.maxHeadSize || widths.some((w) => w !== width)) return undefined;
    const size = width / heads;
    const foldsRight = [query, key, value].every((fold) => this.reshapesTo(fold.split, ['same', 'same', heads, size]) && this.reshapesTo(fold.merge, ['any', 'any', size]));
    if (!foldsRight || !this.reshapesTo(split, ['any', heads, 'any', size]) || !this.reshapesTo(merge, ['same', 'same', width])) return undefined;
    return { query: query.source, key: key.source, value: value.source, heads, scale: scores.scale, output: merge };
  }
}

/**
 * Fuses each of the model's exported attention layers (see the module's comment) with heads of up to
 * `maxHeadSize` into one MultiHeadAttention node, in place, declaring the com.microsoft opset where it
 * fused any; returns how many it fused.
 */
export function fuseAttention(model: proto.IModelProto, maxHeadSize = MAX_HEAD_SIZE): number {
  const graph = model.graph;
  if (!graph || hasSubgraphs(graph)) return 0;
  const opset = Number(model.opsetImport?.find((o) => !o.domain)?.version ?? 0);
  const matcher = new Matcher(new GraphIndex(graph), opset, maxHeadSize);
  const layers = (graph.node ?? []).filter((node) => node.opType === 'Softmax').flatMap((softmax) => matcher.match(softmax) ?? []);
  for (const { query, key, value, heads, scale, output } of layers) {
    output.opType = 'MultiHeadAttention';
    // Named for the layer's output (unique, as tensor names are; node names may be missing or
    // repeated, which onnxruntime refuses), so that profiles say what it is.
    output.name = `${output.output?.[0] ?? ''}/MultiHeadAttention`;
    output.domain = MICROSOFT_DOMAIN;
    output.input = [query, key, value];
    output.attribute = [
      { name: 'num_heads', type: onnx.AttributeProto.AttributeType.INT, i: heads },
      { name: 'scale', type: onnx.AttributeProto.AttributeType.FLOAT, f: scale },
    ];
  }
  if (layers.length === 0) return 0;
  removeUnused(graph);
  if (!model.opsetImport?.some((o) => o.domain === MICROSOFT_DOMAIN)) model.opsetImport = [...(model.opsetImport ?? []), { domain: MICROSOFT_DOMAIN, version: 1 }];
  return layers.length;
}
