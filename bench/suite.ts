/**
 * The benchmark suite (`npm run bench`): every measurement against its baseline, side by side in one
 * run, in one table with the goals of issue #17 beside them, written to a JSON file as well so runs can
 * be compared. About five minutes on a 2-core machine; docs/performance.md explains each row.
 *
 *   npm run bench -- [--out results.json] [--skip-real] [--provider cpu|cuda|webgpu] [--only GROUP,...]
 *
 * --skip-real leaves out the real-architecture exports (../shared/data/real-exports), which take most
 * of the time; without them on disk they are skipped with the reason printed. --provider runs the
 * time-per-image measurements on a GPU provider (the other groups measure the server's own work,
 * which is the same on any provider). --only runs the groups whose names start with one of its words.
 */
import { EXECUTION_PROVIDERS, isExecutionProvider } from '../src/runtime/providers.js';
import { REAL_EXPORTS, haveRealExports, realExport, type RealExportName } from '../test/helpers/real-exports.js';
import { measureColdStart } from './cold-start.js';
import { measureEncoders } from './encoders.js';
import { measureEventLoopStall } from './event-loop.js';
import { measureHttpOverhead } from './http-overhead.js';
import { pictures } from './pictures.js';
import { benchFlags, refuse } from './flags.js';
import { formatRow, formatTable, writeResults, type Row, type Skipped } from './report.js';
import { measureStages } from './stages.js';
import { measureThroughput } from './throughput.js';
import { runWithWorkerMalloc } from './worker-malloc.js';

runWithWorkerMalloc();

const { values } = benchFlags({
  options: { out: { type: 'string' }, 'skip-real': { type: 'boolean', default: false }, provider: { type: 'string', default: 'cpu' }, only: { type: 'string' } },
});
const provider = values.provider;
if (!isExecutionProvider(provider)) refuse(`--provider: expected one of ${EXECUTION_PROVIDERS.join(', ')}`);
const only = values.only?.split(',').map((word) => word.trim());
const real = haveRealExports && !values['skip-real'];
const noReal = values['skip-real'] ? 'left out (--skip-real)' : `${REAL_EXPORTS} is absent (the shared test data beside the checkout)`;

/** Real exports timed at 3 steps (two gaps between denoiser calls): their presets run 4 to 30, and the per-step stages are scaled. */
const EXPORTS: RealExportName[] = ['sd15', 'sd2v', 'sdxl', 'flux'];

const measurements: { group: string; run(): Promise<Row[]>; skip?: string }[] = [
  { group: 'cold start', run: measureColdStart },
  { group: 'HTTP vs in-process', run: measureHttpOverhead },
  { group: 'throughput', run: () => measureThroughput(real ? { name: 'sd15', dir: realExport('sd15'), size: 512 } : undefined) },
  { group: 'time per image: demo-shapes', run: () => measureStages({ name: 'demo-shapes', provider }) },
  ...EXPORTS.map((name) => ({ group: `time per image: ${name}`, run: () => measureStages({ name, dir: realExport(name), measuredSteps: 3, provider }), skip: real ? undefined : noReal })),
  {
    group: 'event-loop stall',
    run: () => measureEventLoopStall(real ? { model: 'sd15', dir: realExport('sd15'), size: 512 } : { model: 'demo-shapes', size: 1024 }),
  },
  {
    group: 'encode',
    async run() {
      const { pictures: list, skipped: why } = await pictures();
      if (why) skipped.push({ group: 'encode', reason: why });
      return measureEncoders(list);
    },
  },
];

// A mistyped word would run nothing, and still write a results file with no rows and say no goal was missed.
const unknown = only?.filter((word) => !measurements.some((m) => m.group.startsWith(word))) ?? [];
if (unknown.length) refuse(`--only: no group starts with ${unknown.map((word) => `'${word}'`).join(', ')}; the groups are ${measurements.map((m) => `'${m.group}'`).join(', ')}`);

const rows: Row[] = [];
const skipped: Skipped[] = [];
const started = performance.now();
for (const m of measurements) {
  if (only && !only.some((word) => m.group.startsWith(word))) continue;
  if (m.skip) {
    skipped.push({ group: m.group, reason: m.skip });
    console.log(`skipped: ${m.group}: ${m.skip}`);
    continue;
  }
  const t = performance.now();
  // One measurement that fails (a model that cannot run here) is reported and the others go on.
  const measured = await m.run().catch((err: Error) => {
    skipped.push({ group: m.group, reason: `failed: ${err.message}` });
    console.log(`failed: ${m.group}: ${err.stack}`);
    return [];
  });
  for (const row of measured) console.log(formatRow(row));
  console.log(`  (${m.group}: ${((performance.now() - t) / 1000).toFixed(0)} s)`);
  rows.push(...measured);
}
console.log(`\nimagegen benchmark suite, ${((performance.now() - started) / 1000).toFixed(0)} s; ratio = measured / baseline (time per image: share of the image's time)\n`);
console.log(formatTable(rows, skipped));
const file = await writeResults(values.out, rows, skipped, { real, provider, ...(only && { only }) });
console.log(`\nresults written to ${file}`);
const missed = rows.filter((r) => r.met === false).length;
console.log(`${rows.filter((r) => r.met !== undefined).length - missed} goals met, ${missed} not met (see docs/performance.md for why)`);
