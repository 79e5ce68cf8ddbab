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

/** How classicAttentionModel's graph departs from diffusers' export (each one a reason not to fuse it). */
export interface ClassicAttentionOptions {
  batch?: number;
  tokens?: number;
  heads?: number;
  headSize?: number;
  /** baddbmm's zero term before the Softmax (as exported), or none (as a processor without it writes). */
  zeros?: boolean;
  /** Something added to the scores that is not zero (a mask): must not be fused. */
  mask?: boolean;
  /** The head count K's fold declares, when not the others'. */
  keyHeads?: number;
  /** The permutation of Q's fold. */
  queryPerm?: number[];
  softmaxAxis?: number;
  /** A graph output besides the layer's: a tensor of the chain that something outside it reads. */
  alsoOutput?: string;
  /** Constant shapes in place of the folds' [-1, tokens, headSize], the unfold's [-1, heads, tokens, headSize] or the output's [-1, tokens, width]. */
  shapes?: { folded?: number[]; unfolded?: number[]; out?: number[] };
}

const FLOAT = onnx.TensorProto.DataType.FLOAT;
const INT64 = onnx.TensorProto.DataType.INT64;
const ints = (name: string, values: number[]): proto.IAttributeProto => ({ name, type: onnx.AttributeProto.AttributeType.INTS, ints: values });
const int = (name: string, value: number): proto.IAttributeProto => ({ name, type: onnx.AttributeProto.AttributeType.INT, i: value });
const int64s = (name: string, values: number[]): proto.ITensorProto => ({ name, dataType: INT64, dims: [values.length], rawData: new Uint8Array(new BigInt64Array(values.map(BigInt)).buffer) });
const floats = (name: string, dims: number[], values: Float32Array): proto.ITensorProto => ({ name, dataType: FLOAT, dims, rawData: new Uint8Array(values.buffer) });

/** What both layouts' graphs share: x [batch, tokens, width] projected to q, k and v by weights, the graph around the nodes, and feeds. */
function attentionModel(options: { batch: number; tokens: number; width: number; alsoOutput?: string }, initializer: proto.ITensorProto[], layer: proto.INodeProto[]) {
  const { batch, tokens, width, alsoOutput } = options;
  const wave = (length: number, f: (i: number) => number) => Float32Array.from({ length }, (_, i) => f(i));
  const projections = ['q', 'k', 'v'].map((name, i) => {
    initializer.push(floats(`W${name}`, [width, width], wave(width * width, (j) => (Math.sin(j * (i + 1.3) + i) + 0.3) / Math.sqrt(width))));
    return node('MatMul', ['x', `W${name}`], [name]);
  });
  const output = [{ name: 'out', type: { tensorType: { elemType: FLOAT } } }, ...(alsoOutput ? [{ name: alsoOutput, type: { tensorType: { elemType: FLOAT } } }] : [])];
  const dims = [batch, tokens, width];
  const graph: proto.IGraphProto = {
    name: 'attention',
    node: [...projections, ...layer],
    initializer,
    input: [{ name: 'x', type: { tensorType: { elemType: FLOAT, shape: { dim: dims.map((d) => ({ dimValue: d })) } } } }],
    output,
  };
  const model: proto.IModelProto = { irVersion: 8, opsetImport: [{ domain: '', version: 17 }], graph };
  return { model, x: wave(batch * tokens * width, (i) => Math.cos(i * 0.37) + 0.5), dims };
}

/** Nodes splitting `input` [batch, tokens, width] into [batch, tokens, heads, width / heads], its shape a Concat of the tensor's own sizes and constants as torch exports it; then transposed by `perm`. */
function splitHeads(input: string, name: string, heads: number, width: number, perm: number[], initializer: proto.ITensorProto[]): proto.INodeProto[] {
  initializer.push(int64s(`${name}Heads`, [heads]), int64s(`${name}Size`, [width / heads]));
  return [
    node('Shape', [input], [`${name}Shape`]),
    node('Gather', [`${name}Shape`, 'zero'], [`${name}B`], [int('axis', 0)]),
    node('Gather', [`${name}Shape`, 'one'], [`${name}T`], [int('axis', 0)]),
    node('Squeeze', [`${name}B`, 'axes'], [`${name}Bs`]),
    node('Squeeze', [`${name}T`, 'axes'], [`${name}Ts`]),
    node('Unsqueeze', [`${name}Bs`, 'axes'], [`${name}B1`]),
    node('Unsqueeze', [`${name}Ts`, 'axes'], [`${name}T1`]),
    node('Concat', [`${name}B1`, `${name}T1`, `${name}Heads`, `${name}Size`], [`${name}SplitShape`], [int('axis', 0)]),
    node('Reshape', [input, `${name}SplitShape`], [`${name}4`]),
    node('Transpose', [`${name}4`], [`${name}T4`], [ints('perm', perm)]),
  ];
}

/** Adds a constant that is not zero (a mask) to the scores `logits`; answers the sum's name. */
function addMask(logits: string, initializer: proto.ITensorProto[], nodes: proto.INodeProto[]): string {
  initializer.push(floats('maskValue', [], new Float32Array([0.25])));
  nodes.push(node('Add', [logits, 'maskValue'], ['masked']));
  return 'masked';
}

const SHAPE_CONSTANTS = () => [int64s('zero', [0]), int64s('one', [1]), int64s('axes', [0])];

/**
 * One self-attention layer as Optimum exports diffusers' classic processor: x [batch, tokens, width]
 * projected to Q, K and V by weights, heads folded into the batch (the first fold's shape a Concat of
 * the tensor's own sizes and constants, as torch exports it), Q·Kᵀ scaled, baddbmm's zeros added,
 * Softmax, times V, heads unfolded: the output `out` is [batch, tokens, width]. Returns the model and
 * feeds for it.
 */
export function classicAttentionModel(options: ClassicAttentionOptions = {}): { model: proto.IModelProto; x: Float32Array; dims: number[] } {
  const { batch = 2, tokens = 12, heads = 2, headSize = 4, zeros = true, mask = false, keyHeads = heads, queryPerm = [0, 2, 1, 3], softmaxAxis = -1, alsoOutput, shapes = {} } = options;
  const width = heads * headSize;
  const nodes: proto.INodeProto[] = [];
  const initializer: proto.ITensorProto[] = [
    ...SHAPE_CONSTANTS(),
    floats('alpha', [], new Float32Array([1 / Math.sqrt(headSize)])),
    floats('beta', [], new Float32Array([0])),
    int64s('unfoldShape', shapes.unfolded ?? [-1, heads, tokens, headSize]),
    int64s('outShape', shapes.out ?? [-1, tokens, width]),
  ];
  for (const name of ['q', 'k', 'v']) {
    const foldHeads = name === 'k' ? keyHeads : heads;
    initializer.push(int64s(`${name}fFolded`, shapes.folded ?? [-1, tokens, width / foldHeads]));
    nodes.push(...splitHeads(name, `${name}f`, foldHeads, width, name === 'q' ? queryPerm : [0, 2, 1, 3], initializer), node('Reshape', [`${name}fT4`, `${name}fFolded`], [`${name}f3`]));
  }
  nodes.push(node('Transpose', ['kf3'], ['kT'], [ints('perm', [0, 2, 1])]), node('MatMul', ['qf3', 'kT'], ['qk']), node('Mul', ['qk', 'alpha'], ['scores']));
  let logits = 'scores';
  if (zeros) {
    nodes.push(node('Shape', ['scores'], ['scoresShape']), node('ConstantOfShape', ['scoresShape'], ['zeros'], [fill(0)]), node('Mul', ['zeros', 'beta'], ['zeroTerm']), node('Add', ['scores', 'zeroTerm'], ['withZeros']));
    logits = 'withZeros';
  }
  if (mask) logits = addMask(logits, initializer, nodes);
  nodes.push(
    node('Softmax', [logits], ['probs'], [int('axis', softmaxAxis)]),
    node('MatMul', ['probs', 'vf3'], ['weighted']),
    node('Reshape', ['weighted', 'unfoldShape'], ['unfolded']),
    node('Transpose', ['unfolded'], ['merged4'], [ints('perm', [0, 2, 1, 3])]),
    node('Reshape', ['merged4', 'outShape'], ['out']),
  );
  return attentionModel({ batch, tokens, width, alsoOutput }, initializer, nodes);
}

/** How sdpaAttentionModel's graph is written, and how it departs from torch's export (a reason not to fuse it). */
export interface SdpaAttentionOptions {
  batch?: number;
  tokens?: number;
  heads?: number;
  headSize?: number;
  /** Kᵀ as torch writes it (one Transpose(0,2,3,1), its peephole pass having joined two) or as two Transposes. */
  keyTransposes?: 1 | 2;
  /** The factor Q and Kᵀ are multiplied by: torch's computed sqrt(1 / sqrt(Q's last size)), Sqrt of a constant scale, or the constant itself (folded). */
  scale?: 'computed' | 'sqrt' | 'folded';
  /** The Slice of Q's shape that the computed scale reads: torch's [-1], or another entry. */
  sliceStart?: number;
  /** Something added to the scores that is not zero (a mask). */
  mask?: boolean;
}

/**
 * One self-attention layer as torch's exporter writes diffusers' AttnProcessor2_0 (scaled_dot_product
 * attention, what Optimum exports with torch 2.1 and later): Q, K and V split into heads [B,H,T,D], Q
 * and Kᵀ each multiplied by the square root of the scale (computed from Q's shape, as torch does when
 * no scale is given), Q·Kᵀ, Softmax, times V, heads transposed back and merged: `out` [batch, tokens, width].
 */
export function sdpaAttentionModel(options: SdpaAttentionOptions = {}): { model: proto.IModelProto; x: Float32Array; dims: number[] } {
  const { batch = 2, tokens = 12, heads = 2, headSize = 4, keyTransposes = 1, scale = 'computed', sliceStart = -1, mask = false } = options;
  const width = heads * headSize;
  const initializer: proto.ITensorProto[] = [...SHAPE_CONSTANTS(), int64s('outShape', [-1, tokens, width])];
  const nodes = [
    ...splitHeads('q', 'qs', heads, width, [0, 2, 1, 3], initializer),
    ...splitHeads('k', 'ks', heads, width, keyTransposes === 1 ? [0, 2, 3, 1] : [0, 2, 1, 3], initializer),
    ...splitHeads('v', 'vs', heads, width, [0, 2, 1, 3], initializer),
  ];
  let key = 'ksT4';
  if (keyTransposes === 2) {
    nodes.push(node('Transpose', ['ksT4'], ['kT'], [ints('perm', [0, 1, 3, 2])]));
    key = 'kT';
  }
  if (scale === 'folded') initializer.push(floats('factor', [], new Float32Array([headSize ** -0.25])));
  else if (scale === 'sqrt') {
    initializer.push(floats('scale', [], new Float32Array([headSize ** -0.5])));
    nodes.push(node('Sqrt', ['scale'], ['factor']));
  } else {
    initializer.push(int64s('sliceStart', [sliceStart]), int64s('sliceEnd', [2 ** 53]), floats('unit', [1], new Float32Array([1])));
    nodes.push(
      node('Shape', ['qsT4'], ['queryShape']),
      node('Slice', ['queryShape', 'sliceStart', 'sliceEnd'], ['lastSize']),
      node('Cast', ['lastSize'], ['lastSizeFloat'], [int('to', FLOAT)]),
      node('Sqrt', ['lastSizeFloat'], ['rootSize']),
      node('Div', ['unit', 'rootSize'], ['computedScale']),
      node('Cast', ['computedScale'], ['scale'], [int('to', FLOAT)]),
      node('Sqrt', ['scale'], ['factor']),
    );
  }
  nodes.push(node('Mul', ['qsT4', 'factor'], ['qScaled']), node('Mul', [key, 'factor'], ['kScaled']), node('MatMul', ['qScaled', 'kScaled'], ['scores']));
  let logits = 'scores';
  if (mask) logits = addMask(logits, initializer, nodes);
  nodes.push(
    node('Softmax', [logits], ['probs'], [int('axis', -1)]),
    node('MatMul', ['probs', 'vsT4'], ['weighted']),
    node('Transpose', ['weighted'], ['merged4'], [ints('perm', [0, 2, 1, 3])]),
    node('Reshape', ['merged4', 'outShape'], ['out']),
  );
  return attentionModel({ batch, tokens, width }, initializer, nodes);
}

/** How headsFirstAttentionModel's graph is written, and how it departs from FLUX's export (a reason not to fuse it). */
export interface HeadsFirstAttentionOptions {
  batch?: number;
  tokens?: number;
  heads?: number;
  headSize?: number;
  /** Joint attention: a second projection of x (FLUX's text) joined before the image's along the tokens, in Q, K and V: twice the tokens. */
  joint?: boolean;
  /** The axis Q's and K's parts are joined along (FLUX's 2: the tokens). */
  concatAxis?: number;
  /** The permutation that makes Kᵀ (FLUX's 0,1,3,2). */
  keyPerm?: number[];
  /** Something added to the scores that is not zero (a mask). */
  mask?: boolean;
}

/**
 * One attention layer as Optimum exports FLUX's (torch 1.13, so no scaled_dot_product_attention):
 * x [batch, tokens, width] projected to Q, K and V and split into heads [B,H,T,D]; with `joint`, a
 * second set of projections joined before them along the tokens; Q and K RMS-normalized and turned by
 * a rotary embedding (x·cos + rotate(x)·sin, cos and sin per token and channel), each Cast to float as
 * torch writes it; Q·Kᵀ scaled, Softmax, times V, heads transposed back and merged: `out` [batch,
 * tokens (twice that with `joint`), width].
 */
export function headsFirstAttentionModel(options: HeadsFirstAttentionOptions = {}): { model: proto.IModelProto; x: Float32Array; dims: number[] } {
  const { batch = 2, tokens = 12, heads = 2, headSize = 4, joint = true, concatAxis = 2, keyPerm = [0, 1, 3, 2], mask = false } = options;
  const [width, total] = [heads * headSize, joint ? 2 * tokens : tokens];
  const angles = (f: (a: number) => number) => Float32Array.from({ length: total * headSize }, (_, i) => f(Math.floor(i / headSize) * ((i % headSize) + 1) * 0.1));
  const initializer: proto.ITensorProto[] = [
    ...SHAPE_CONSTANTS(),
    int64s('outShape', [-1, total, width]),
    floats('alpha', [], new Float32Array([1 / Math.sqrt(headSize)])),
    floats('unit', [], new Float32Array([1])),
    floats('cos', [1, 1, total, headSize], angles(Math.cos)),
    floats('sin', [1, 1, total, headSize], angles(Math.sin)),
  ];
  const nodes: proto.INodeProto[] = [];
  if (joint) {
    for (const name of ['q', 'k', 'v']) {
      const weights = Float32Array.from({ length: width * width }, (_, j) => Math.cos(j * 0.7 + name.charCodeAt(0)) / Math.sqrt(width));
      initializer.push(floats(`Wtext${name}`, [width, width], weights));
      nodes.push(node('MatMul', ['x', `Wtext${name}`], [`text${name}`]), ...splitHeads(`text${name}`, `text${name}s`, heads, width, [0, 2, 1, 3], initializer));
    }
  }
  // The heads of Q, K or V: the image's split, after the text's where joint.
  const joined = (name: string, axis: number) => {
    nodes.push(...splitHeads(name, `${name}s`, heads, width, [0, 2, 1, 3], initializer));
    if (!joint) return `${name}sT4`;
    nodes.push(node('Concat', [`text${name}sT4`, `${name}sT4`], [`${name}Joint`], [int('axis', axis)]));
    return `${name}Joint`;
  };
  // RMSNorm (x / sqrt(mean(x²))), then the rotary embedding (x·cos + (-x)·sin standing for its rotated pairs), then a Cast.
  const turned = (name: string) => {
    const x = joined(name, concatAxis);
    nodes.push(
      node('Mul', [x, x], [`${name}Square`]),
      node('ReduceMean', [`${name}Square`], [`${name}Mean`], [ints('axes', [-1])]),
      node('Sqrt', [`${name}Mean`], [`${name}Root`]),
      node('Div', ['unit', `${name}Root`], [`${name}Inverse`]),
      node('Mul', [x, `${name}Inverse`], [`${name}Normed`]),
      node('Mul', [`${name}Normed`, 'cos'], [`${name}Cos`]),
      node('Neg', [`${name}Normed`], [`${name}Rotated`]),
      node('Mul', [`${name}Rotated`, 'sin'], [`${name}Sin`]),
      node('Add', [`${name}Cos`, `${name}Sin`], [`${name}Turned`]),
      node('Cast', [`${name}Turned`], [`${name}Final`], [int('to', FLOAT)]),
    );
    return `${name}Final`;
  };
  const [query, key, value] = [turned('q'), turned('k'), joined('v', 2)];
  nodes.push(node('Transpose', [key], ['kT'], [ints('perm', keyPerm)]), node('MatMul', [query, 'kT'], ['qk']), node('Mul', ['qk', 'alpha'], ['scores']));
  const logits = mask ? addMask('scores', initializer, nodes) : 'scores';
  nodes.push(
    node('Softmax', [logits], ['probs'], [int('axis', -1)]),
    node('MatMul', ['probs', value], ['weighted']),
    node('Transpose', ['weighted'], ['merged4'], [ints('perm', [0, 2, 1, 3])]),
    node('Reshape', ['merged4', 'outShape'], ['out']),
  );
  return attentionModel({ batch, tokens, width }, initializer, nodes);
}
