/**
 * How well the memory plan predicts what a batch takes (src/pipelines/memory-plan.ts): for each real
 * export, a fresh process loads the model (which calibrates it at half and three quarters of its native side, one step each), asks
 * the plan what one image at a larger size will take, then makes that image and measures its peak above
 * the loaded model. A ratio under 1 means the plan expected less than the batch took (the OOM killer's
 * risk); far above 1 means it refuses sizes that would fit.
 *
 *   npm run bench:memory-plan
 */
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { inspectModel } from '../src/models/layout.js';
import { MemoryPlan } from '../src/pipelines/memory-plan.js';
import { WorkerRuntime } from '../src/pipelines/run.js';
import { peakBytes, resetPeak, residentBytes } from '../src/runtime/memory.js';
import type { GenerationBatch } from '../src/runtime/types.js';
import { haveRealExports, REAL_EXPORTS, realExport, type RealExportName } from '../test/helpers/real-exports.js';

const CASES: { name: RealExportName; sizes: string[] }[] = [
  { name: 'sd15', sizes: ['512x512', '768x512'] },
  { name: 'sd2v', sizes: ['768x768', '1024x768'] },
  { name: 'sdxl', sizes: ['1024x1024', '1152x896'] },
  { name: 'flux', sizes: ['1024x1024', '1216x832'] },
];
const MiB = 2 ** 20;

interface Prediction {
  predictedMiB: number;
  measuredMiB: number;
}

/** In the child: load (and so calibrate) the model, ask the plan, make the image, measure it. */
async function predictAndMeasure(name: RealExportName, size: string): Promise<Prediction> {
  const dir = realExport(name);
  const [width, height] = size.split('x').map(Number);
  const runtime = new WorkerRuntime({ runtime: { provider: 'cpu', threads: 2 } });
  const before = residentBytes();
  const pipeline = await runtime.getPipeline(dir);
  const figures = runtime.modelMemory(dir)!;
  const batch: GenerationBatch = { modelDir: dir, width, height, steps: 2, guidanceScale: 2, items: [{ prompt: 'a cat', negativePrompt: '', seed: 1 }] };
  // A plan of its own with the calibrated figures: what a fresh worker would expect, nothing yet held.
  const predicted = new MemoryPlan({ [dir]: figures }).estimate(await inspectModel(dir), batch, Infinity, pipeline.samplesPerImage(batch));
  resetPeak();
  await runtime.generateImages(batch);
  const measured = peakBytes() - (before + figures.weightsBytes);
  return { predictedMiB: predicted / MiB, measuredMiB: measured / MiB };
}

const args = process.argv.slice(2);
if (args[0] === '--child') {
  console.log(JSON.stringify(await predictAndMeasure(args[1] as RealExportName, args[2])));
} else if (!haveRealExports) {
  console.error(`needs the real-architecture exports at ${REAL_EXPORTS} (shared/ beside the checkout)`);
  process.exitCode = 2;
} else {
  console.log('export  size        | predicted MiB  measured MiB | predicted/measured');
  for (const { name, sizes } of CASES) {
    for (const size of sizes) {
      const out = execFileSync(process.execPath, ['--import', 'tsx', fileURLToPath(import.meta.url), '--child', name, size], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
      const { predictedMiB, measuredMiB } = JSON.parse(out.trim().split('\n').at(-1)!) as Prediction;
      console.log(`${name.padEnd(7)} ${size.padEnd(11)} | ${predictedMiB.toFixed(0).padStart(13)} ${measuredMiB.toFixed(0).padStart(13)} | x${(predictedMiB / measuredMiB).toFixed(2)}`);
    }
  }
  console.log('Each row a fresh process: the model calibrated at 1/2 and 3/4 of its native side (one step), then one image at the size, 2 steps, guidance 2.');
}
