import { existsSync, statSync } from 'node:fs';
import path from 'node:path';
import { InvalidArgumentError, Option, type Command } from 'commander';
import { loadModelSettings } from '../config.js';
import { Progress, STEPS } from '../util/progress.js';
import type { GoldenCase } from './golden.js';
import { DEFAULT_TOLERANCE, FP16_TOLERANCE } from './tolerance.js';
import { exitStatusOf } from './exit-status.js';
import { messageOf } from '../util/error-message.js';
import { pathArgument } from './path-argument.js';

/**
 * `imagegen models verify DIR --golden FILE.json`: one line per case, `case N: max_abs=… mean_abs=…
 * PASS|FAIL` (pixel errors on a 0..1 scale), exit code 1 when any case fails. docs/verify.md says how
 * to write a golden file for a model of one's own.
 */

/** Where an installed model's folder is, when `dir` is no folder here but the id of one in MODELS_DIR. */
function installedHint(dir: string): string {
  if (existsSync(dir) || path.isAbsolute(dir)) return '';
  try {
    const { modelsDir } = loadModelSettings({});
    const installed = modelsDir && path.join(modelsDir, dir);
    return installed && existsSync(installed) ? ` (the installed model '${dir}' is the folder ${installed})` : '';
  } catch {
    // Settings that do not load are what the message already reports.
    return '';
  }
}

interface VerifyFlags {
  golden: string;
  tolerance: number;
}

/** A pixel error from 0 to 1, as a number (0.0059) or in 8-bit steps as the docs write them (1.5/255). */
function parseTolerance(value: string): number {
  const [, of255] = /^\s*([\d.]+)\s*\/\s*255\s*$/.exec(value) ?? [];
  const t = of255 !== undefined ? Number(of255) / 255 : value.trim() === '' ? NaN : Number(value);
  // Commander reports this error with the option's name and exits (with 2, as every usage error: see main.ts).
  if (!Number.isFinite(t) || t < 0 || t > 1) throw new InvalidArgumentError(`It takes a pixel error from 0 to 1, such as ${DEFAULT_TOLERANCE.toFixed(4)} or 1.5/255.`);
  return t;
}

export function registerVerifyCommand(models: Command): void {
  models
    .command('verify')
    .description("check a model folder against diffusers' pictures for it: runs each case of a golden file from its starting noise")
    .argument('<dir>', 'model folder (an ONNX export)', pathArgument)
    .requiredOption('--golden <file>', 'golden file (JSON; see docs/verify.md)', pathArgument)
    .addOption(
      new Option('--tolerance <max_abs>', `largest pixel error that passes, on a 0..1 scale (fp16 exports: ${FP16_TOLERANCE.toFixed(4)})`)
        .argParser(parseTolerance)
        .default(DEFAULT_TOLERANCE, `${DEFAULT_TOLERANCE.toFixed(4)}, 1.5/255: the 8-bit rounding of both pictures`),
    )
    .action(async (dir: string, flags: VerifyFlags) => {
      let progress: Progress | undefined;
      let cases: readonly GoldenCase[] = [];
      try {
        const config = loadModelSettings({});
        // Loaded here, not at the top, as in generate: --help and the other commands start without sharp, onnxruntime and the pipelines.
        const [{ commandRuntime }, { verifyGolden }] = await Promise.all([import('./command-runtime.js'), import('./golden.js')]);
        const { runtime, keepFigures } = await commandRuntime(config, (message) => {
          progress?.clear();
          console.error(`imagegen models verify: ${message}`);
        });
        const results = await verifyGolden(runtime, dir, flags.golden, flags.tolerance, {
          // The denoising steps of every case on stderr: loading a real model and running a case at its native size take minutes on a CPU.
          onStart: (all) => {
            cases = all;
            progress = new Progress(process.stderr, `verifying ${dir}`, all.reduce((sum, c) => sum + c.steps, 0), 0, STEPS);
          },
          onCaseStart: (index) => {
            const c = cases[index];
            progress?.startFile(`case ${index} (${c.width}x${c.height}, ${c.steps} steps)`);
            return progress?.loop(c.steps);
          },
          onCase: (r) => {
            keepFigures(path.resolve(dir));
            progress?.clear();
            console.log(`case ${r.index}: max_abs=${r.maxAbs.toFixed(6)} mean_abs=${r.meanAbs.toFixed(6)} ${r.pass ? 'PASS' : 'FAIL'}`);
          },
        });
        progress?.finish();
        const failed = results.filter((r) => !r.pass).length;
        console.log(failed ? `${failed} of ${results.length} cases FAIL (tolerance ${flags.tolerance.toFixed(4)})` : `${results.length} of ${results.length} cases PASS`);
        if (failed) process.exitCode = 1;
      } catch (err) {
        progress?.clear();
        console.error(`imagegen models verify: ${messageOf(err)}${installedHint(dir)}`);
        // A folder that is not there (nothing, or a file) is an argument refused, whatever failed first on the way.
        process.exitCode = statSync(dir, { throwIfNoEntry: false })?.isDirectory() ? exitStatusOf(err) : 2;
      }
    });
}
