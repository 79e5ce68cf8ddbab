/**
 * What src/runtime/graph-rewrite.ts buys: one call of each graph as exported, with the exact rewrites
 * only (GRAPH_REWRITES=exact: baddbmm's zeros dropped) and with all of them (the default: attention also
 * fused on the CPU), side by side in one run, on each provider asked for, with the same feeds, taking
 * turns (median of 5 calls each after a warm-up); the largest difference of each rewritten output from
 * the exported one; and the peak resident memory of a process that loads the graph and makes one call
 * (each variant in a fresh process of its own, CPU only).
 *
 *   npm run bench:graph-rewrite -- [--model DIR] [--providers cpu,webgpu] [--side 64] [--head-sizes]
 *
 * --model is an export of ../shared/data/real-exports' widths (32-wide text states): SD-style (unet/
 * and vae_decoder/) or FLUX (transformer/, one call a denoising step, and vae_decoder/); --side the
 * latents' side (64: 512x512). --head-sizes also times one hand-made attention layer of 4096 tokens (a
 * 512x512 image's first UNet block) as exported and fused on the CPU, for each head size of the real
 * models and in each layout the fusion knows: where fusion stops paying, which sets MAX_HEAD_SIZE in
 * src/runtime/attention-fusion.ts.
 */
import { execFile } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import os from 'node:os';
import { promisify } from 'node:util';
import { ort } from '../src/runtime/onnxruntime.js';
import onnxProto from 'onnx-proto';
import { fuseAttention } from '../src/runtime/attention-fusion.js';
import { graphSource, rewritesOf, type GraphSource } from '../src/runtime/graph-rewrite.js';
import { createSession, EXECUTION_PROVIDERS, isExecutionProvider, type ExecutionProvider, type GraphRewrites } from '../src/runtime/providers.js';
import { classicAttentionModel, headsFirstAttentionModel, sdpaAttentionModel } from '../test/helpers/attention-graph.js';
import { EXPORT_FEEDS } from '../test/helpers/export-feeds.js';
import { realExport } from '../test/helpers/real-exports.js';
import { benchFlags, refuse, wholeNumber } from './flags.js';
import { sideBySide } from './stats.js';
import { largestDifference } from '../src/util/difference.js';

const { values } = benchFlags({
  options: {
    model: { type: 'string', default: realExport('sd15') },
    providers: { type: 'string', default: 'cpu' },
    side: { type: 'string', default: '64' },
    'head-sizes': { type: 'boolean', default: false },
    // Internal: be the child process that measures one variant's peak (part:variant).
    peak: { type: 'string' },
  },
});
const side = wholeNumber('side', values.side);
const providers = values.providers.split(',');
if (!providers.every(isExecutionProvider)) refuse(`--providers: expected some of ${EXECUTION_PROVIDERS.join(', ')}`);
type Part = keyof typeof EXPORT_FEEDS;
type Variant = 'exported' | GraphRewrites;
const VARIANTS: readonly Variant[] = ['exported', 'exact', 'all'];

/** How many rewrites a variant makes on `provider`. */
const rewriteCount = (variant: Variant, provider: ExecutionProvider) => (variant === 'exported' ? 0 : rewritesOf(variant).filter((r) => r.providers.includes(provider)).length);

/** The graph of one variant: the file itself, or what the set of rewrites makes of it on `provider`. */
const sourceOf = (file: string, variant: Variant, provider: ExecutionProvider): Promise<GraphSource> =>
  variant === 'exported' ? Promise.resolve(file) : graphSource(file, provider, rewritesOf(variant));

/** A session of `graph` on `provider`, with the server's session options. */
async function sessionOf(graph: GraphSource, provider: ExecutionProvider): Promise<ort.InferenceSession> {
  return (await createSession(graph, { provider, threads: os.availableParallelism() })).session;
}

/** The feeds of one part of the model at --side, the VAE's latents as wide as its config says (FLUX's 16). */
function feedsOf(part: Part): Record<string, ort.Tensor> {
  if (part !== 'vae_decoder') return EXPORT_FEEDS[part](side);
  const config = JSON.parse(readFileSync(`${values.model}/vae_decoder/config.json`, 'utf8')) as { latent_channels?: number };
  return EXPORT_FEEDS.vae_decoder(side, config.latent_channels);
}

const outputOf = async (session: ort.InferenceSession, feeds: Record<string, ort.Tensor>) => (await session.run(feeds))[session.outputNames[0]].data as Float32Array;

if (values.peak) {
  const [part, variant] = values.peak.split(':') as [Part, Variant];
  const session = await sessionOf(await sourceOf(`${values.model}/${part}/model.onnx`, variant, 'cpu'), 'cpu');
  await session.run(feedsOf(part));
  console.log(process.resourceUsage().maxRSS * 1024);
  process.exit(0);
}

/** Peak resident bytes of a fresh process that loads one variant on the CPU and makes one call. */
async function peakOf(part: Part, variant: Variant): Promise<number> {
  const args = ['--import', 'tsx', import.meta.filename, '--model', values.model, '--side', String(side), '--peak', `${part}:${variant}`];
  const { stdout } = await promisify(execFile)(process.execPath, args, { maxBuffer: 1024 ** 2 });
  return Number(stdout.trim().split('\n').at(-1));
}

const mib = (bytes: number) => `${(bytes / 1024 ** 2).toFixed(0)} MiB`;
for (const part of (Object.keys(EXPORT_FEEDS) as Part[]).filter((p) => existsSync(`${values.model}/${p}/model.onnx`))) {
  const feeds = () => feedsOf(part);
  const file = `${values.model}/${part}/model.onnx`;
  for (const provider of providers) {
    // A set that makes no more rewrites on the provider than the one before it is not timed again.
    const distinct = VARIANTS.filter((variant, i) => i === 0 || rewriteCount(variant, provider) > rewriteCount(VARIANTS[i - 1], provider));
    const sessions = await Promise.all(distinct.map(async (variant) => sessionOf(await sourceOf(file, variant, provider), provider)));
    // The first calls also compile the GPU provider's kernels: not timed.
    const outputs = await Promise.all(sessions.map((s) => outputOf(s, feeds())));
    const times = await sideBySide(sessions.map((s) => () => s.run(feeds())), 5);
    await Promise.all(sessions.map((s) => s.release()));
    const peaks = provider === 'cpu' ? await Promise.all(distinct.map((variant) => peakOf(part, variant))) : [];
    const columns = distinct.map((variant, i) => {
      const ratio = i === 0 ? '' : ` x${(times[i] / times[0]).toFixed(2)}, largest difference ${largestDifference(outputs[i], outputs[0]).toExponential(1)}`;
      return `${variant} ${times[i].toFixed(1)} ms${ratio}${peaks[i] ? `, peak ${mib(peaks[i])}` : ''}`;
    });
    console.log(`${part} ${side * 8}x${side * 8} on ${provider}: ${columns.join('; ')}`);
  }
}

/**
 * Heads of SD 1.5's first block (8 of 40), SDXL's and SD 2's (of 64), wider ones, and the VAEs'
 * single head of 512 (whose smaller batch keeps the unfused scores within this machine's memory).
 */
const HEAD_SHAPES = [
  { batch: 2, heads: 8, headSize: 40 },
  { batch: 2, heads: 10, headSize: 64 },
  { batch: 2, heads: 8, headSize: 128 },
  { batch: 1, heads: 4, headSize: 256 },
  { batch: 1, heads: 1, headSize: 512 },
];

if (values['head-sizes']) {
  // The classic layout without baddbmm's zeros, as the exact rewrite leaves the exports' attention
  // before fusing it; the 4-D layout as torch 2.1 and later export scaled_dot_product_attention; FLUX's
  // joint attention of 2048 text and 2048 image tokens, computed on the heads (RMSNorm, rotary).
  const layouts = [
    ['classic', (shape: (typeof HEAD_SHAPES)[number]) => classicAttentionModel({ ...shape, tokens: 4096, zeros: false })],
    ['4-D', (shape: (typeof HEAD_SHAPES)[number]) => sdpaAttentionModel({ ...shape, tokens: 4096 })],
    ['heads-first (FLUX)', (shape: (typeof HEAD_SHAPES)[number]) => headsFirstAttentionModel({ ...shape, tokens: 2048 })],
  ] as const;
  for (const [layout, modelOf] of layouts) {
    for (const shape of HEAD_SHAPES) {
      const { model, x, dims } = modelOf(shape);
      const fused = structuredClone(model);
      // Fused whatever the head size, to see what fusing the widest would cost.
      fuseAttention(fused, Infinity);
      const sessions = await Promise.all([model, fused].map((m) => sessionOf({ bytes: onnxProto.onnx.ModelProto.encode(m).finish(), folder: os.tmpdir() }, 'cpu')));
      const feeds = { x: new ort.Tensor('float32', x, dims) };
      const [exported, rewritten] = await Promise.all(sessions.map((s) => outputOf(s, feeds)));
      const [before, after] = await sideBySide(sessions.map((s) => () => s.run(feeds)), 3);
      await Promise.all(sessions.map((s) => s.release()));
      console.log(`${layout} attention layer, batch ${shape.batch}, 4096 tokens, ${shape.heads} heads of ${shape.headSize}: unfused ${before.toFixed(1)} ms, fused ${after.toFixed(1)} ms x${(after / before).toFixed(2)}, largest difference ${largestDifference(rewritten, exported).toExponential(1)}`);
    }
  }
}
