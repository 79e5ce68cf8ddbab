import onnxProto from 'onnx-proto';
import type { onnx as proto } from 'onnx-proto';
import { fillsFloatZero, GraphIndex, removeUnused } from './onnx-graph.js';

/**
 * A rewrite of exported graphs (see graph-rewrite.ts): diffusers' attention, as Optimum's exports of
 * SD and SDXL UNets and FLUX transformers carry it, made one com.microsoft.MultiHeadAttention node. As
 * exported, each attention layer splits its heads off (Reshape to [B,T,H,D], Transpose), multiplies Q
 * by Kᵀ into a tensor of scores per head and token pair, scales it, takes its Softmax, multiplies by V
 * and merges the heads again: at 512x512 SD 1.5's first blocks hold 1 GiB of scores per call for that.
 * onnxruntime's CPU kernel of MultiHeadAttention computes the same thing in blocks (flash attention)
 * without ever holding the scores: on this project's 2-core machine the SD 1.5 test
 * export's UNet call at 768x768 took x0.66 the time and peaked at 264 MiB instead of 2965, its output
 * within 3e-6 of the unfused graph's (docs/performance.md, `npm run bench:graph-rewrite`).
 *
 * Fusion pays for heads of 40 to 256 (x0.75 to x0.88 per layer with its projections) but not for the
 * 512 of the VAEs' single-headed attention (x1.27; the tiled decode bounds its memory instead), so only
 * heads of up to MAX_HEAD_SIZE are fused. Only the CPU provider gets this graph (graph-rewrite.ts):
 * the WebGPU provider's kernel differed from the exported chain by 1.5e-3 on lavapipe, and the CUDA
 * provider's could not be measured here.
 *
 * Three layouts of the chain are fused, as exporters write them:
 * - classic (diffusers' AttnProcessor, which Optimum exports with torch before 2.1, and so the test
 *   exports): Q, K and V each split as above, with the same constant head count at the split shape's
 *   entry 2, and their heads folded into the batch (Reshape to [B·H,T,D]); Q·Kᵀ (Kᵀ a Transpose of the last two axes) scaled by a constant (Mul or Div) or not, plus
 *   nothing but a constant-zero term (baddbmm's, see attention-zeros.ts), Softmax on the last axis,
 *   Casts to float only, times V, unfolded by a Reshape to [B,H,T,D] (the same H at entry 1), a
 *   Transpose(0,2,1,3) and a Reshape.
 * - 4-D (AttnProcessor2_0's scaled_dot_product_attention, which Optimum exports with torch 2.1 and
 *   later): Q, K and V split into [B,H,T,D] and never folded; torch's exporter multiplies Q and Kᵀ each
 *   by the square root of the scale, which it computes from Q's shape as 1 / sqrt(D) (or a constant
 *   once folded); then the Softmax, times V, a Transpose(0,2,1,3) and a Reshape merge the heads.
 * - heads-first (FLUX's attention processor, exported with torch before 2.1): Q, K and V split into
 *   [B,H,T,D] and then computed on further: RMSNorm and the rotary embedding on Q and K, the text's
 *   tokens joined before the image's (see `computed`); Q·Kᵀ (Kᵀ a Transpose(0,1,3,2)) scaled as in
 *   the classic layout, the Softmax, times V, a Transpose(0,2,1,3) and a Reshape merge the heads. The
 *   fused node reads each of Q, K and V that is only a projection's split as that projection, and the
 *   others merged into [B,T,H·D] by a Transpose and a Reshape put before it: the kernel takes K and V as
 *   [B,H,T,D] too, but then computes the scores whole, which was slower than the exported chain (x1.4
 *   to x1.7 per layer of heads of 64 and 128, docs/performance.md).
 * The last Reshape becomes the fused node, so every reader of the layer's output reads the same values,
 * and the links then read by nothing are removed; a link that something else also reads (the Shapes
 * that compute the folds' sizes, a graph output) stays, as does all of a chain any link of which fails
 * a check. Q, K and V must be float32 projections (MatMul by a float initializer, plus a bias or not),
 * which also gives the head size. Every Reshape's shape must have the rank of its place in the chain,
 * and its constant entries the sizes of their axes (a computed entry is onnxruntime's to check, as it
 * does when the exported graph runs). A link that a subgraph (If, Loop: FLUX computes its positions
 * in Loops) reads stays, as the graph index counts the node holding the subgraph as its reader.
 */

const { onnx } = onnxProto;

/** Widest head fused (see the module's comment). */
export const MAX_HEAD_SIZE = 256;

/** The opset that holds MultiHeadAttention. */
const MICROSOFT_DOMAIN = 'com.microsoft';

/** Q, K or V as the fused node is to read it: a [B,T,H·D] tensor, or a [B,H,T,D] one (`perHead`) to merge into that first. */
interface Input {
  name: string;
  perHead: boolean;
}

/** One attention layer found as exported: its Q, K and V, width, head count and scale, and the node that gives its unfolded output. */
interface ExportedAttention {
  inputs: readonly Input[];
  width: number;
  heads: number;
  scale: number;
  /** The last Reshape of the chain, whose output is the layer's [B,T,H·D]. */
  output: proto.INodeProto;
}

/** A Reshape of the chain and the shape it must have, given the head size. */
type ReshapeCheck = readonly [proto.INodeProto, (size: number) => readonly (number | 'same' | 'any')[]];

/** Q, K or V of a layer: the projection it comes from, its head count, and the Reshapes that split its heads. */
interface Fold {
  source: string;
  heads: number;
  reshapes: ReshapeCheck[];
}

/** What a layout of the chain found: its Q, K and V, the inputs of the fused node where they are not the Folds' sources, the rank of its scores, the Reshape that merges the heads again, its other Reshapes, and the factor it scales the scores by besides `scaled`'s, given the head size. */
interface Layout {
  query: Fold;
  key: Fold;
  value: Fold;
  inputs?: readonly Input[];
  rank: number;
  merge: proto.INodeProto;
  reshapes: ReshapeCheck[];
  factor(size: number): number | undefined;
}

const sameValues = (values: number[] | undefined, wanted: number[]) => values?.length === wanted.length && values.every((v, i) => v === wanted[i]);

const sameInts = (attribute: proto.IAttributeProto | undefined, ints: number[]) => sameValues(attribute?.ints?.map(Number), ints);

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
   * size (the head count, the head size, the width), 'same' the input's own size at that axis
   * (0 copies it), 'any' a size of the batch or tokens. An entry computed from sizes at run time can
   * only be checked by onnxruntime, so it passes, as does -1 (one at most: the size that makes the
   * count of values right) and a positive constant in place of 'same' or 'any'.
   */
  private reshapesTo(reshape: proto.INodeProto, expected: readonly (number | 'same' | 'any')[]): boolean {
    const shape = this.index.shape(reshape.input?.[1]);
    // With allowzero set, a 0 is a size of 0, not a copy.
    const copies = !Number(reshape.attribute?.find((a) => a.name === 'allowzero')?.i ?? 0);
    if (!shape || shape.length !== expected.length || shape.filter((entry) => entry === -1).length > 1) return false;
    return shape.every((entry, i) => {
      const wanted = expected[i];
      if (entry === undefined || entry === -1) return true;
      if (typeof wanted === 'number') return entry === wanted;
      return entry > 0 || (entry === 0 && wanted === 'same' && copies);
    });
  }

  /** [B,T,H·D] -> Reshape [B,T,H,D] -> Transpose(0,2,1,3): the heads made an axis of their own, as both layouts do. */
  private split(name: string | null | undefined, perm = [0, 2, 1, 3]): Fold | undefined {
    const transpose = this.index.producer(name, 'Transpose');
    const split = this.index.producer(transpose?.input?.[0], 'Reshape');
    const heads = this.index.shape(split?.input?.[1])?.[2];
    if (!split?.input?.[0] || !this.perm(transpose, perm) || !heads || heads < 1) return undefined;
    return { source: split.input[0], heads, reshapes: [[split, (size) => ['same', 'same', heads, size]]] };
  }

  /** The classic layout's fold, the heads then folded into the batch: a split as above -> Reshape [B·H,T,D]. */
  private folded(name: string | null | undefined): Fold | undefined {
    const merge = this.index.producer(name, 'Reshape');
    const split = this.split(merge?.input?.[0]);
    return merge && split && { ...split, reshapes: [...split.reshapes, [merge, (size) => ['any', 'any', size]]] };
  }

  /** The 4-D layout's Kᵀ: a split as above transposed again (0,1,3,2), or both Transposes made one (0,2,3,1) as torch's exporter does. */
  private keyTransposed(name: string | null | undefined): Fold | undefined {
    const again = this.index.producer(name, 'Transpose');
    return this.split(name, [0, 2, 3, 1]) ?? (this.perm(again, [0, 1, 3, 2]) ? this.split(again?.input?.[0]) : undefined);
  }

  /**
   * A [B,H,T,D] tensor computed from splits as above by operations that keep that layout, as FLUX's
   * attention computes its Q, K and V: Casts to float, elementwise arithmetic (RMSNorm, the rotary
   * embedding: what of it does not come from a split only scales or shifts the split's values) and
   * Concats along the tokens (joint attention over the text's and the image's). The head count and
   * head size of every split it comes from must agree, and so must their projections' widths; the Fold
   * takes the first split's projection as its source.
   */
  private computed(name: string, known = new Map<string, Fold | undefined>()): Fold | undefined {
    const split = this.split(name);
    const node = this.index.producers.get(name);
    // A tensor reached again answers as before; one reached again while still being walked (a damaged graph's loop) answers none.
    if (split || !node || known.has(name)) return split ?? known.get(name);
    known.set(name, undefined);
    const inputs = node.input ?? [];
    const to = node.attribute?.find((a) => a.name === 'to')?.i;
    const axis = Number(node.attribute?.find((a) => a.name === 'axis')?.i);
    let folds: (Fold | undefined)[];
    if (node.opType === 'Cast' && Number(to) === onnx.TensorProto.DataType.FLOAT) folds = [this.computed(inputs[0], known)];
    else if (node.opType === 'Concat' && (axis === 2 || axis === -2)) folds = inputs.map((input) => this.computed(input, known));
    // Of arithmetic, the operands that come from splits (the others are what the split is scaled by, shifted by or divided by).
    else if (['Add', 'Sub', 'Mul', 'Div'].includes(node.opType ?? '')) folds = inputs.map((input) => this.computed(input, known)).filter(Boolean);
    else return undefined;
    const [first] = folds;
    const agree = (fold: Fold | undefined): fold is Fold => fold !== undefined && first !== undefined && fold.heads === first.heads && this.width(fold.source) === this.width(first.source);
    const fold = first && folds.every(agree) ? { ...first, reshapes: folds.flatMap((f) => f.reshapes) } : undefined;
    known.set(name, fold);
    return fold;
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

  /**
   * A factor that torch's export of scaled_dot_product_attention multiplies Q and Kᵀ by: the square root
   * of its scale, a constant once folded, else Sqrt of a constant or of the scale torch computes from Q
   * as 1 / sqrt(Q's last size): Div(1, Sqrt(Cast(Slice(Shape(Q), -1)))), maybe Cast again. Its value,
   * given that Q ([B,H,T,D]) is `query` and D is `size`.
   */
  private sdpaFactor(name: string, query: string, size: number): number | undefined {
    const constant = this.index.values(name);
    if (constant) return constant.length === 1 ? constant[0] : undefined;
    const root = this.index.producer(name, 'Sqrt');
    const scale = this.throughCasts(root?.input?.[0] ?? '', true);
    const folded = this.index.values(scale);
    if (folded) return folded.length === 1 && folded[0] > 0 ? Math.sqrt(folded[0]) : undefined;
    const division = this.index.producer(scale, 'Div');
    const [one, divisor] = division?.input ?? [];
    const slice = this.index.producer(this.throughCasts(this.index.producer(divisor, 'Sqrt')?.input?.[0] ?? '', true), 'Slice');
    const shape = this.index.producer(slice?.input?.[0], 'Shape');
    const [starts, ends] = [slice?.input?.[1], slice?.input?.[2]].map((input) => this.index.values(input));
    // Q's shape has 4 entries: the Slice from -1 to 4 or beyond (torch writes INT64_MAX) is its last.
    const lastOnly = starts?.length === 1 && starts[0] === -1 && ends?.length === 1 && ends[0] >= 4 && (slice?.input?.length ?? 0) <= 4;
    const fromQuery = shape?.input?.[0] === query && !shape.attribute?.length;
    return sameValues(this.index.values(one), [1]) && lastOnly && fromQuery ? size ** -0.25 : undefined;
  }

  /** The classic layout: Q and K folded into the batch, Kᵀ a Transpose(0,2,1), V folded, the product unfolded by Reshape [B,H,T,D], Transpose and Reshape. */
  private classic(queryIn: string, keyIn: string, weighted: proto.INodeProto): Layout | undefined {
    const transpose = this.index.producer(keyIn, 'Transpose');
    const unfold = this.reader(weighted.output?.[0], 'Reshape');
    const transposeBack = this.reader(unfold?.output?.[0], 'Transpose');
    const merge = this.reader(transposeBack?.output?.[0], 'Reshape');
    const [query, key, value] = [this.folded(queryIn), this.perm(transpose, [0, 2, 1]) ? this.folded(transpose?.input?.[0]) : undefined, this.folded(weighted.input?.[1])];
    if (!query || !key || !value || !unfold || !merge || !this.perm(transposeBack, [0, 2, 1, 3])) return undefined;
    const heads = query.heads;
    return { query, key, value, rank: 3, merge, reshapes: [[unfold, (size) => ['any', heads, 'any', size]]], factor: () => 1 };
  }

  /** The 4-D layout of torch's scaled_dot_product_attention export: Q, K and V split into heads, Q and Kᵀ each times a factor (sdpaFactor), the product's heads transposed back and merged. */
  private sdpa(queryIn: string, keyIn: string, weighted: proto.INodeProto): Layout | undefined {
    const [queryScaling, keyScaling] = [queryIn, keyIn].map((name) => this.index.producer(name, 'Mul'));
    const [queryHeads, queryFactor] = queryScaling?.input ?? [];
    const [keyHeads, keyFactor] = keyScaling?.input ?? [];
    const transposeBack = this.reader(weighted.output?.[0], 'Transpose');
    const merge = this.reader(transposeBack?.output?.[0], 'Reshape');
    const [query, key, value] = [this.split(queryHeads), this.keyTransposed(keyHeads), this.split(weighted.input?.[1])];
    if (!query || !key || !value || !merge || !this.perm(transposeBack, [0, 2, 1, 3])) return undefined;
    const factor = (size: number) => {
      const [q, k] = [queryFactor, keyFactor].map((name) => this.sdpaFactor(name, queryHeads, size));
      return q !== undefined && k !== undefined ? q * k : undefined;
    };
    return { query, key, value, rank: 4, merge, reshapes: [], factor };
  }

  /**
   * The 4-D layout of attention computed on [B,H,T,D] tensors after the split (FLUX's: RMSNorm and the
   * rotary embedding on Q and K, text and image tokens joined; see computed): Q·Kᵀ, Kᵀ a
   * Transpose(0,1,3,2), the product scaled (`scaled`), times V, the heads transposed back and merged.
   * The fused node reads the projection of each that is a split as it is, the others merged into
   * [B,T,H·D] (fuseAttention).
   */
  private headsFirst(queryIn: string, keyIn: string, weighted: proto.INodeProto): Layout | undefined {
    const transpose = this.index.producer(keyIn, 'Transpose');
    const transposeBack = this.reader(weighted.output?.[0], 'Transpose');
    const merge = this.reader(transposeBack?.output?.[0], 'Reshape');
    const [keyHeads, valueHeads] = [transpose?.input?.[0] ?? '', weighted.input?.[1] ?? ''];
    const [query, key, value] = [this.computed(queryIn), this.perm(transpose, [0, 1, 3, 2]) ? this.computed(keyHeads) : undefined, this.computed(valueHeads)];
    if (!query || !key || !value || !merge || !this.perm(transposeBack, [0, 2, 1, 3])) return undefined;
    const inputs = [queryIn, keyHeads, valueHeads].map((name) => ({ name: this.split(name)?.source ?? name, perHead: !this.split(name) }));
    return { query, key, value, inputs, rank: 4, merge, reshapes: [], factor: () => 1 };
  }

  /** The attention layer whose Softmax this is, when every link of its chain passes. */
  match(softmax: proto.INodeProto): ExportedAttention | undefined {
    const scores = this.scaled(this.throughCasts(softmax.input?.[0] ?? '', true));
    const probabilities = this.throughCasts(softmax.output?.[0] ?? '', false);
    const weighted = this.reader(probabilities, 'MatMul');
    if (!scores || !weighted || weighted.input?.[0] !== probabilities) return undefined;
    const [queryIn, keyIn] = scores.product.input ?? [];
    const layout = this.classic(queryIn, keyIn, weighted) ?? this.sdpa(queryIn, keyIn, weighted) ?? this.headsFirst(queryIn, keyIn, weighted);
    const axis = softmax.attribute?.find((a) => a.name === 'axis');
    // Before opset 13 Softmax flattened its input from the axis on: another operation.
    const lastAxis = axis ? Number(axis.i) === -1 || Number(axis.i) === (layout?.rank ?? 0) - 1 : this.opset >= 13;
    if (!layout || !lastAxis) return undefined;

    const { query, key, value, merge } = layout;
    const heads = query.heads;
    const width = this.width(query.source);
    const widths = [key, value].map((v) => this.width(v.source));
    if (key.heads !== heads || value.heads !== heads) return undefined;
    if (!width || width % heads !== 0 || width / heads > this.maxHeadSize || widths.some((w) => w !== width)) return undefined;
    const size = width / heads;
    const reshapes: ReshapeCheck[] = [...query.reshapes, ...key.reshapes, ...value.reshapes, ...layout.reshapes, [merge, () => ['same', 'same', width]]];
    const factor = layout.factor(size);
    if (!reshapes.every(([reshape, expected]) => this.reshapesTo(reshape, expected(size))) || factor === undefined || !Number.isFinite(factor) || factor === 0) return undefined;
    const inputs = layout.inputs ?? [query, key, value].map((fold) => ({ name: fold.source, perHead: false }));
    return { inputs, width, heads, scale: scores.scale * factor, output: merge };
  }
}

/**
 * Fuses each of the model's exported attention layers (see the module's comment) with heads of up to
 * `maxHeadSize` into one MultiHeadAttention node, in place, declaring the com.microsoft opset where it
 * fused any; returns how many it fused.
 */
export function fuseAttention(model: proto.IModelProto, maxHeadSize = MAX_HEAD_SIZE): number {
  const graph = model.graph;
  if (!graph) return 0;
  const opset = Number(model.opsetImport?.find((o) => !o.domain)?.version ?? 0);
  const matcher = new Matcher(new GraphIndex(graph), opset, maxHeadSize);
  const layers = (graph.node ?? []).filter((node) => node.opType === 'Softmax').flatMap((softmax) => matcher.match(softmax) ?? []);
  const merges = new Map<proto.INodeProto, proto.INodeProto[]>();
  for (const { inputs, width, heads, scale, output } of layers) {
    // Named for the layer's output (unique, as tensor names are; node names may be missing or
    // repeated, which onnxruntime refuses), so that profiles say what it is.
    const name = `${output.output?.[0] ?? ''}/MultiHeadAttention`;
    const merged = inputs.map(({ name: input, perHead }, i) => (perHead ? mergeHeads(input, `${name}/${['query', 'key', 'value'][i]}`, width) : []));
    merges.set(output, merged.flat());
    output.opType = 'MultiHeadAttention';
    output.name = name;
    output.domain = MICROSOFT_DOMAIN;
    output.input = inputs.map(({ name: input }, i) => merged[i].at(-1)?.output?.[0] ?? input);
    output.attribute = [
      { name: 'num_heads', type: onnx.AttributeProto.AttributeType.INT, i: heads },
      { name: 'scale', type: onnx.AttributeProto.AttributeType.FLOAT, f: scale },
    ];
  }
  if (layers.length === 0) return 0;
  // Before the node that reads them, where Q is computed already: the graph's nodes stay in order.
  graph.node = (graph.node ?? []).flatMap((node) => [...(merges.get(node) ?? []), node]);
  removeUnused(graph);
  if (!model.opsetImport?.some((o) => o.domain === MICROSOFT_DOMAIN)) model.opsetImport = [...(model.opsetImport ?? []), { domain: MICROSOFT_DOMAIN, version: 1 }];
  return layers.length;
}

/**
 * Nodes that make `heads` ([B,H,T,D]) the [B,T,H·D] that MultiHeadAttention's CPU kernel computes in
 * blocks: a Transpose(0,2,1,3), then a Reshape to [B,T,width], named `name` and after it. (The kernel
 * also takes K and V as [B,H,T,D], but then holds the scores whole.) The width is a constant: a tensor
 * whose head count is not the one found (a broadcast the graph cannot show) makes onnxruntime fail
 * the call rather than attend over other heads.
 */
function mergeHeads(heads: string, name: string, width: number): proto.INodeProto[] {
  const shape: proto.ITensorProto = { dataType: onnx.TensorProto.DataType.INT64, dims: [3], int64Data: [0, 0, width] };
  return [
    { opType: 'Transpose', name: `${name}/transpose`, input: [heads], output: [`${name}/transposed`], attribute: [{ name: 'perm', type: onnx.AttributeProto.AttributeType.INTS, ints: [0, 2, 1, 3] }] },
    { opType: 'Constant', name: `${name}/shape`, output: [`${name}/shape`], attribute: [{ name: 'value', type: onnx.AttributeProto.AttributeType.TENSOR, t: shape }] },
    { opType: 'Reshape', name: `${name}/merge`, input: [`${name}/transposed`, `${name}/shape`], output: [name] },
  ];
}
