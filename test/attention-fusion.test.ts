import path from 'node:path';
import { ort } from '../src/runtime/onnxruntime.js';
import onnxProto from 'onnx-proto';
import type { onnx as proto } from 'onnx-proto';
import { describe, expect, it } from 'vitest';
import { fuseAttention, MAX_HEAD_SIZE } from '../src/runtime/attention-fusion.js';
import { graphSource, rewritesOf } from '../src/runtime/graph-rewrite.js';
import {
  classicAttentionModel,
  headsFirstAttentionModel,
  node,
  sdpaAttentionModel,
  type ClassicAttentionOptions,
  type HeadsFirstAttentionOptions,
  type SdpaAttentionOptions,
} from './helpers/attention-graph.js';
import { largestDifference } from '../src/util/difference.js';
import { exportOutput } from './helpers/export-feeds.js';
import { haveRealExports, REAL_EXPORT_NAMES, realExport } from './helpers/real-exports.js';

const { onnx } = onnxProto;

/** The `out` of a hand-made attention model for its feeds, run on the CPU. */
async function run(model: proto.IModelProto, x: Float32Array, dims: number[]): Promise<Float32Array> {
  const session = await ort.InferenceSession.create(onnx.ModelProto.encode(model).finish());
  try {
    return (await session.run({ x: new ort.Tensor('float32', x, dims) }, ['out'])).out.data as Float32Array;
  } finally {
    await session.release();
  }
}

const opTypes = (model: proto.IModelProto) => model.graph!.node!.map((n) => n.opType);

/** Fuses a copy of a hand-made model (after `change`); answers what fused, the outputs before and after, and the fused model. */
async function fused({ model, x, dims }: ReturnType<typeof classicAttentionModel>, change: (model: proto.IModelProto) => void = () => {}) {
  change(model);
  const copy = structuredClone(model);
  const count = fuseAttention(copy);
  return { count, model: copy, exported: await run(model, x, dims), rewritten: await run(copy, x, dims) };
}

describe('fusing exported attention into MultiHeadAttention', () => {
  it('fuses the exported chain, with and without baddbmm zeros, into one node giving the same output', async () => {
    for (const zeros of [true, false]) {
      const { count, model, exported, rewritten } = await fused(classicAttentionModel({ zeros, heads: 3, headSize: 8 }));
      expect(count).toBe(1);
      const attention = model.graph!.node!.filter((n) => n.opType === 'MultiHeadAttention');
      expect(attention).toHaveLength(1);
      // Named for its output, unique as tensor names are (the exporter's node names may be missing or repeated).
      expect(attention[0]).toMatchObject({ name: 'out/MultiHeadAttention', domain: 'com.microsoft', input: ['q', 'k', 'v'], output: ['out'] });
      expect(attention[0].attribute!.find((a) => a.name === 'num_heads')!.i).toBe(3);
      expect(attention[0].attribute!.find((a) => a.name === 'scale')!.f).toBeCloseTo(1 / Math.sqrt(8), 7);
      expect(model.opsetImport).toContainEqual({ domain: 'com.microsoft', version: 1 });
      // The chain, and the sizes computed only for it, are gone: the projections and the fused node
      // remain, and of the initializers the projections' weights.
      expect(opTypes(model).sort()).toEqual(['MatMul', 'MatMul', 'MatMul', 'MultiHeadAttention']);
      expect(model.graph!.initializer!.map((t) => t.name).sort()).toEqual(['Wk', 'Wq', 'Wv']);
      expect(largestDifference(rewritten, exported)).toBeLessThan(1e-6);
      expect(Math.max(...exported.map(Math.abs))).toBeGreaterThan(0.1);
    }
  });

  it('keeps a link of the chain that something else reads, and still gives the same output', async () => {
    const { count, model, exported, rewritten } = await fused(classicAttentionModel({ alsoOutput: 'probs' }));
    expect(count).toBe(1);
    expect(opTypes(model)).toContain('Softmax');
    expect(largestDifference(rewritten, exported)).toBeLessThan(1e-6);
  });

  it('fuses a graph that holds subgraphs, keeping what their bodies read', async () => {
    // An If whose branches read the probabilities, the chain's Softmax, without naming them as an input.
    const readsProbabilities = (model: proto.IModelProto) => {
      const graph = model.graph!;
      const branch = (name: string): proto.IGraphProto => ({ name, node: [node('Identity', ['probs'], [`${name}Out`])], output: [{ name: `${name}Out`, type: { tensorType: { elemType: onnx.TensorProto.DataType.FLOAT } } }] });
      graph.initializer!.push({ name: 'yes', dataType: onnx.TensorProto.DataType.BOOL, dims: [], int32Data: [1] });
      graph.node!.push(node('If', ['yes'], ['chosen'], [{ name: 'then_branch', type: onnx.AttributeProto.AttributeType.GRAPH, g: branch('then') }, { name: 'else_branch', type: onnx.AttributeProto.AttributeType.GRAPH, g: branch('else') }]));
      graph.output!.push({ name: 'chosen', type: { tensorType: { elemType: onnx.TensorProto.DataType.FLOAT } } });
    };
    const { count, model, exported, rewritten } = await fused(classicAttentionModel({ zeros: false }), readsProbabilities);
    expect(count).toBe(1);
    expect(opTypes(model)).toContain('Softmax');
    expect(largestDifference(rewritten, exported)).toBeLessThan(1e-6);
  });

  it('leaves every chain that is not exactly the exported attention as it is', async () => {
    // Heads wider than fusion pays for; a mask added to the scores; Q folded another way; K folded into
    // other heads than Q; a Softmax over another axis; folds into half the head size over twice the
    // tokens, an unfold into twice the head size, an output left 4-D (each of these three runs, meaning
    // something else than attention over the heads).
    const others: ClassicAttentionOptions[] = [
      { heads: 1, headSize: MAX_HEAD_SIZE + 8, tokens: 4 },
      { mask: true },
      { queryPerm: [0, 1, 2, 3] },
      { keyHeads: 1 },
      { softmaxAxis: 1 },
      { shapes: { folded: [-1, 24, 2] } },
      { shapes: { unfolded: [-1, 2, 6, 8] } },
      { shapes: { out: [-1, 12, 2, 4] } },
    ];
    for (const options of others) {
      const { model, x, dims } = classicAttentionModel(options);
      const before = structuredClone(model);
      expect(fuseAttention(model), JSON.stringify(options)).toBe(0);
      expect(model).toEqual(before);
      if (options.shapes) expect((await run(model, x, dims)).length).toBe(dims.reduce((a, b) => a * b));
    }
    // The widest heads fused.
    expect((await fused(classicAttentionModel({ heads: 1, headSize: MAX_HEAD_SIZE, tokens: 4 }))).count).toBe(1);
  });
});

describe("fusing torch's export of scaled_dot_product_attention", () => {
  it('fuses the 4-D layout into one node giving the same output, whether its scale is computed from Q or a constant', async () => {
    const written: SdpaAttentionOptions[] = [{}, { keyTransposes: 2 }, { scale: 'sqrt' }, { scale: 'folded', heads: 3, headSize: 8 }];
    for (const options of written) {
      const { count, model, exported, rewritten } = await fused(sdpaAttentionModel(options));
      expect(count, JSON.stringify(options)).toBe(1);
      expect(opTypes(model).sort()).toEqual(['MatMul', 'MatMul', 'MatMul', 'MultiHeadAttention']);
      const attention = model.graph!.node!.find((n) => n.opType === 'MultiHeadAttention')!;
      expect(attention.input).toEqual(['q', 'k', 'v']);
      expect(attention.attribute!.find((a) => a.name === 'scale')!.f).toBeCloseTo(1 / Math.sqrt(options.headSize ?? 4), 6);
      expect(largestDifference(rewritten, exported)).toBeLessThan(1e-6);
      expect(Math.max(...exported.map(Math.abs))).toBeGreaterThan(0.1);
    }
  });

  it('leaves it as exported where the scale is read from another size, or a mask is added', async () => {
    for (const options of [{ sliceStart: 0 }, { sliceStart: -2 }, { mask: true }] satisfies SdpaAttentionOptions[]) {
      const { model } = sdpaAttentionModel(options);
      const before = structuredClone(model);
      expect(fuseAttention(model), JSON.stringify(options)).toBe(0);
      expect(model).toEqual(before);
    }
  });
});

describe("fusing attention computed on the heads after the split (FLUX's export)", () => {
  it('fuses joint and single attention after RMSNorm and the rotary embedding, merging the heads of what is not a projection split as it is', async () => {
    for (const joint of [true, false]) {
      const { count, model, exported, rewritten } = await fused(headsFirstAttentionModel({ joint, heads: 3, headSize: 8 }));
      expect(count).toBe(1);
      const attention = model.graph!.node!.find((n) => n.opType === 'MultiHeadAttention')!;
      // V of single attention is its projection's split: the projection itself.
      expect(attention.input).toEqual(['out/MultiHeadAttention/query', 'out/MultiHeadAttention/key', joint ? 'out/MultiHeadAttention/value' : 'v']);
      expect(attention.attribute!.find((a) => a.name === 'num_heads')!.i).toBe(3);
      expect(attention.attribute!.find((a) => a.name === 'scale')!.f).toBeCloseTo(1 / Math.sqrt(8), 7);
      expect(opTypes(model)).not.toContain('Softmax');
      expect(largestDifference(rewritten, exported)).toBeLessThan(1e-6);
      expect(Math.max(...exported.map(Math.abs))).toBeGreaterThan(0.1);
    }
  });

  it('leaves it as exported where Q and K are joined along another axis, Kᵀ is not the last two axes swapped, or a mask is added', () => {
    for (const options of [{ concatAxis: 3 }, { keyPerm: [0, 1, 2, 3] }, { mask: true }] satisfies HeadsFirstAttentionOptions[]) {
      const { model } = headsFirstAttentionModel(options);
      const before = structuredClone(model);
      expect(fuseAttention(model), JSON.stringify(options)).toBe(0);
      expect(model).toEqual(before);
    }
  });
});

describe.skipIf(!haveRealExports)('attention fusion on the real exports (needs ../shared/data/real-exports)', () => {
  it('fuses every attention layer of the SD and SDXL UNets, within 1e-5 of the exported output', { timeout: 120_000 }, async () => {
    // SDXL's UNet also takes pooled text and time ids, which these feeds lack: the goldens run it fused.
    for (const name of REAL_EXPORT_NAMES.filter((n) => n !== 'flux')) {
      const file = path.join(realExport(name), 'unet', 'model.onnx');
      const source = await graphSource(file, 'cpu');
      if (typeof source === 'string') throw new Error(`${name}'s UNet was not rewritten`);
      const nodes = onnx.ModelProto.decode(source.bytes).graph!.node!;
      expect(nodes.filter((n) => n.opType === 'Softmax'), name).toEqual([]);
      expect(nodes.filter((n) => n.opType === 'MultiHeadAttention').length, name).toBeGreaterThanOrEqual(32);
      if (name === 'sdxl') continue;
      const [exported, rewritten] = [await exportOutput(file, 'unet', 16), await exportOutput(source, 'unet', 16)];
      expect(largestDifference(rewritten, exported), name).toBeLessThan(1e-5);
      expect(Math.max(...exported.map(Math.abs)), name).toBeGreaterThan(0.1);
    }
  });

  it("fuses the three attention layers of FLUX's transformer (one joint, two single), within 1e-5 of the exported output", async () => {
    const file = path.join(realExport('flux'), 'transformer', 'model.onnx');
    const source = await graphSource(file, 'cpu');
    if (typeof source === 'string') throw new Error("FLUX's transformer was not rewritten");
    const nodes = onnx.ModelProto.decode(source.bytes).graph!.node!;
    expect(nodes.filter((n) => n.opType === 'Softmax')).toEqual([]);
    expect(nodes.filter((n) => n.opType === 'MultiHeadAttention').map((n) => n.name)).toEqual([
      '/transformer_blocks.0/attn/Reshape_10_output_0/MultiHeadAttention',
      '/single_transformer_blocks.0/attn/Reshape_7_output_0/MultiHeadAttention',
      '/single_transformer_blocks.1/attn/Reshape_7_output_0/MultiHeadAttention',
    ]);
    // Its positions' Loops are kept, with all they read.
    expect(nodes.filter((n) => n.opType === 'Loop')).toHaveLength(6);
    const [exported, rewritten] = [await exportOutput(file, 'transformer', 32), await exportOutput(source, 'transformer', 32)];
    expect(largestDifference(rewritten, exported)).toBeLessThan(1e-5);
    expect(Math.max(...exported.map(Math.abs))).toBeGreaterThan(0.1);
  });

  it('is made for the CPU provider only, and not where only exact rewrites are asked for', async () => {
    const file = path.join(realExport('sd15'), 'unet', 'model.onnx');
    for (const source of [await graphSource(file, 'webgpu'), await graphSource(file, 'cpu', rewritesOf('exact'))]) {
      if (typeof source === 'string') throw new Error('the zeros were not dropped');
      const nodes = onnx.ModelProto.decode(source.bytes).graph!.node!;
      expect(nodes.some((n) => n.opType === 'MultiHeadAttention')).toBe(false);
      expect(nodes.filter((n) => n.opType === 'Softmax')).toHaveLength(32);
    }
  });
});
