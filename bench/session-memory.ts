/**
 * What onnxruntime's CPU memory arena costs and buys, per component of the real-architecture exports
 * (../shared/data/real-exports), measured side by side: each (export, component, arena on/off) runs in a
 * fresh process, which reports its resident memory after the runs, its peak, and the time per run. The
 * pipelines keep the arena for the denoiser (run once per step) and turn it off for the VAE decoder
 * (run once per image at full resolution): this benchmark is the measurement behind that choice.
 *
 *   npm run bench:session-memory
 */
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { peakBytes, residentBytes } from '../src/runtime/memory.js';
import { OnnxModel } from '../src/runtime/onnx-model.js';
import type { HostTensor } from '../src/runtime/onnx-model.js';
import { inspectModel } from '../src/models/layout.js';
import { denoiserCall } from '../test/helpers/denoiser-feeds.js';
import { REAL_EXPORTS, realExport, type RealExportName } from '../test/helpers/real-exports.js';

const CASES: { name: RealExportName; size: number }[] = [
  { name: 'sd15', size: 512 },
  { name: 'sd2v', size: 768 },
  { name: 'sdxl', size: 1024 },
  { name: 'flux', size: 1024 },
];
const COMPONENTS = ['denoiser', 'vae_decoder'] as const;
type Component = (typeof COMPONENTS)[number];
/** Denoiser calls per measurement: a short denoising loop. */
const DENOISER_RUNS = 4;
const MiB = 2 ** 20;

interface Measurement {
  afterMiB: number;
  peakMiB: number;
  msPerRun: number;
}

/** In the child: load one component, run it, report. */
async function measure(name: RealExportName, size: number, component: Component, arena: boolean): Promise<Measurement> {
  const layout = await inspectModel(realExport(name));
  const file = component === 'denoiser' ? layout.denoiser : layout.vaeDecoder;
  const model = await OnnxModel.load(file, { provider: 'cpu', threads: 2 }, { memoryArena: arena });
  let call: { feeds: Record<string, HostTensor>; output: string; runs: number };
  if (component === 'denoiser') {
    const { feeds, output } = denoiserCall(layout, size, size);
    call = { feeds, output, runs: DENOISER_RUNS };
  } else {
    const side = size / layout.vae.scaleFactor;
    const channels = layout.family === 'flux' ? 16 : 4;
    call = { feeds: { latent_sample: { data: new Float32Array(channels * side * side), dims: [1, channels, side, side] } }, output: 'sample', runs: 1 };
  }
  const started = performance.now();
  for (let i = 0; i < call.runs; i++) await model.run(call.feeds, [call.output]);
  const msPerRun = (performance.now() - started) / call.runs;
  return { afterMiB: residentBytes() / MiB, peakMiB: peakBytes() / MiB, msPerRun };
}

function inChild(name: RealExportName, size: number, component: Component, arena: boolean): Measurement {
  const out = execFileSync(process.execPath, ['--import', 'tsx', fileURLToPath(import.meta.url), '--child', name, String(size), component, arena ? 'on' : 'off'], {
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  return JSON.parse(out.trim().split('\n').at(-1)!) as Measurement;
}

const args = process.argv.slice(2);
if (args[0] === '--child') {
  const [name, size, component, arena] = args.slice(1);
  console.log(JSON.stringify(await measure(name as RealExportName, Number(size), component as Component, arena === 'on')));
} else if (!existsSync(REAL_EXPORTS)) {
  console.error(`needs the real-architecture exports at ${REAL_EXPORTS} (shared/ beside the checkout)`);
  process.exitCode = 2;
} else {
  const f = (n: number) => n.toFixed(0).padStart(7);
  console.log('export  size  component      | arena on: after   peak    ms/run | arena off: after   peak    ms/run | off/on: after  time');
  for (const { name, size } of CASES) {
    for (const component of COMPONENTS) {
      const on = inChild(name, size, component, true);
      const off = inChild(name, size, component, false);
      console.log(
        `${name.padEnd(7)} ${String(size).padEnd(5)} ${component.padEnd(14)} |      ${f(on.afterMiB)} ${f(on.peakMiB)} ${f(on.msPerRun)} |       ${f(off.afterMiB)} ${f(off.peakMiB)} ${f(off.msPerRun)} |     x${(off.afterMiB / on.afterMiB).toFixed(2)}  x${(off.msPerRun / on.msPerRun).toFixed(2)}`,
      );
    }
  }
  console.log('MiB resident after the runs and at the peak; each row two fresh processes. Keep the arena where time/on matters and after/on does not.');
}
