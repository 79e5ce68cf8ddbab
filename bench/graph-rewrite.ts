/**
 * What src/runtime/graph-rewrite.ts buys: one call of each graph as exported and as rewritten (the
 * zeros of baddbmm attention replaced by a scalar), side by side in one run, on each provider asked
 * for, with the same feeds, taking turns (median of 5 calls each after a warm-up), and the largest
 * difference of their outputs (0 expected).
 *
 *   npm run bench:graph-rewrite -- [--model DIR] [--providers cpu,webgpu] [--side 64]
 *
 * --model is an SD-style export (unet/ and vae_decoder/ with 4-channel latents and 32-wide text
 * states, as the real exports in ../shared/data/real-exports); --side the latents' side (64: 512x512).
 */
import { parseArgs } from 'node:util';
import * as ort from 'onnxruntime-node';
import os from 'node:os';
import { graphSource, type GraphSource } from '../src/runtime/graph-rewrite.js';
import { createSession, EXECUTION_PROVIDERS, isExecutionProvider, type ExecutionProvider } from '../src/runtime/providers.js';
import { EXPORT_FEEDS } from '../test/helpers/export-feeds.js';
import { realExport } from '../test/helpers/real-exports.js';
import { sideBySide } from './stats.js';
import { largestDifference } from '../test/helpers/difference.js';

const { values } = parseArgs({
  options: { model: { type: 'string', default: realExport('sd15') }, providers: { type: 'string', default: 'cpu' }, side: { type: 'string', default: '64' } },
});
const side = Number(values.side);
const providers = values.providers.split(',');
if (!providers.every(isExecutionProvider)) throw new Error(`--providers: expected some of ${EXECUTION_PROVIDERS.join(', ')}`);

/** A session of `graph` on `provider`, with the server's session options. */
async function sessionOf(graph: GraphSource, provider: ExecutionProvider): Promise<ort.InferenceSession> {
  return (await createSession(graph, { provider, threads: os.availableParallelism() })).session;
}

/** The largest difference between the two sessions' outputs for the same feeds. */
async function outputDifference(a: ort.InferenceSession, b: ort.InferenceSession, feeds: Record<string, ort.Tensor>): Promise<number> {
  const [x, y] = await Promise.all([a, b].map(async (s) => (await s.run(feeds))[s.outputNames[0]].data as Float32Array));
  return largestDifference(x, y);
}

for (const [part, feedsOf] of Object.entries(EXPORT_FEEDS)) {
  const feeds = () => feedsOf(side);
  const file = `${values.model}/${part}/model.onnx`;
  const rewritten = await graphSource(file);
  if (typeof rewritten === 'string') {
    console.log(`${part}: nothing to rewrite`);
    continue;
  }
  for (const provider of providers) {
    const sessions = [await sessionOf(file, provider), await sessionOf(rewritten, provider)];
    // The first calls also compile the GPU provider's kernels: not timed.
    const largest = await outputDifference(sessions[0], sessions[1], feeds());
    const [before, after] = await sideBySide(sessions.map((s) => () => s.run(feeds())), 5);
    await Promise.all(sessions.map((s) => s.release()));
    console.log(`${part} ${side * 8}x${side * 8} on ${provider}: as exported ${before.toFixed(1)} ms, rewritten ${after.toFixed(1)} ms, x${(after / before).toFixed(2)}; largest difference ${largest}`);
  }
}
