/**
 * What onnxruntime's CPU memory arena costs and buys, per component of the real-architecture exports
 * (../shared/data/real-exports), and what malloc's transparent huge pages change in either case (the
 * workers' default, MALLOC_HUGE_PAGES: see src/engine/malloc-tunables.ts), measured side by side: each
 * (export, component, arena on/off, huge pages or not) runs in a fresh process, which reports its
 * resident memory after the runs, its peak, and the time per run. The pipelines keep the arena for the
 * denoiser (run once per step) and turn it off for the VAE decoder (run once per image at full
 * resolution): this benchmark is the measurement behind that choice and behind the huge pages.
 *
 *   npm run bench:session-memory
 */
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { withHugePages } from '../src/engine/malloc-tunables.js';
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

/** The settings a child measures under: onnxruntime's arena, and malloc's huge pages as a worker gets them. */
interface Variant {
  arena: boolean;
  hugePages: boolean;
}
const VARIANTS: readonly Variant[] = [
  { arena: true, hugePages: false },
  { arena: false, hugePages: false },
  { arena: true, hugePages: true },
  { arena: false, hugePages: true },
];

function inChild(name: RealExportName, size: number, component: Component, { arena, hugePages }: Variant): Measurement {
  // glibc reads its tunables as a process starts: each variant is a process of its own anyway.
  const tunables = hugePages ? withHugePages(undefined) : 'glibc.malloc.hugetlb=0';
  const out = execFileSync(process.execPath, ['--import', 'tsx', fileURLToPath(import.meta.url), '--child', name, String(size), component, arena ? 'on' : 'off'], {
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'inherit'],
    env: { ...process.env, GLIBC_TUNABLES: tunables },
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
  const f = (n: number) => n.toFixed(0).padStart(6);
  const x = (n: number) => `x${n.toFixed(2)}`.padStart(6);
  const label = ({ arena, hugePages }: Variant) => `arena ${arena ? 'on ' : 'off'}${hugePages ? ' + huge pages' : ''}`;
  console.log(`export  size  component      | ${VARIANTS.map((v) => `${label(v)}: after   peak ms/run`.padStart(39)).join(' | ')} | arena off/on: after   time | huge pages/not, as used: after   time`);
  for (const { name, size } of CASES) {
    for (const component of COMPONENTS) {
      const [on, off, onHuge, offHuge] = VARIANTS.map((variant) => inChild(name, size, component, variant));
      // As the pipelines run each component: the denoiser with the arena, the VAE decoder without.
      const [plain, huge] = component === 'denoiser' ? [on, onHuge] : [off, offHuge];
      console.log(
        `${name.padEnd(7)} ${String(size).padEnd(5)} ${component.padEnd(14)} | ${[on, off, onHuge, offHuge].map((m) => `${f(m.afterMiB)} ${f(m.peakMiB)} ${f(m.msPerRun)}`.padStart(39)).join(' | ')} |` +
          `        ${x(off.afterMiB / on.afterMiB)} ${x(off.msPerRun / on.msPerRun)} |                      ${x(huge.afterMiB / plain.afterMiB)} ${x(huge.msPerRun / plain.msPerRun)}`,
      );
    }
  }
  console.log('MiB resident after the runs and at the peak; each row four fresh processes. Keep the arena where time/on matters and after/on does not.');
}
