import { encodeImage } from '../src/pipelines/encode-image.js';
import { WorkerRuntime } from '../src/pipelines/run.js';
import { defaultRuntime, type ExecutionProvider } from '../src/runtime/providers.js';
import type { RgbImage } from '../src/runtime/types.js';
import { startBenchServer } from './bench-server.js';
import { ipcTransferMs } from './ipc.js';
import type { Row } from './report.js';
import { StageTimer, type Component, type StageTotals } from './stage-timer.js';
import { median, ms, timed } from './stats.js';

/**
 * Time per image, split into stages, for one model at its default size, steps and guidance: tokenize,
 * text encoders, denoiser, tensor conversion, scheduler and other JS of the loop, VAE (onnxruntime and
 * JS), PNG encoding, IPC from the worker, and HTTP. The pipeline stages are timed in this process on a
 * WorkerRuntime (see StageTimer); IPC carries the encoded image over a worker channel (ipc.ts); HTTP is
 * a b64_json request's time at the client less the generation time the server logs for it. Models
 * whose preset runs many steps are timed at `measuredSteps` and their per-step stages scaled to the
 * preset's steps (the table says so): the denoiser's run and conversion in proportion, the loop's own
 * JS as the shortest gap between two denoiser calls times the steps.
 */

export interface StageCase {
  /** Model id as installed (the embedded 'demo-shapes', or a real export's folder name). */
  name: string;
  /** Its folder, installed for the run; undefined for the embedded model. */
  dir?: string;
  /** Steps actually run in-process; the preset's standard steps when undefined or larger. */
  measuredSteps?: number;
  /** Where the models run, in-process and in the server's worker; default cpu. */
  provider?: ExecutionProvider;
}

const PROMPT = 'a red circle on a blue background';

export async function measureStages({ name, dir, measuredSteps, provider = 'cpu' }: StageCase): Promise<Row[]> {
  const bench = await startBenchServer(dir ? { [name]: dir } : {}, { EXECUTION_PROVIDER: provider });
  try {
    const { model, batches: [preset] } = await bench.plan({ model: name, prompt: PROMPT, seed: 1 });
    const steps = Math.min(preset.steps, measuredSteps ?? preset.steps);
    const [batch] = (await bench.plan({ model: name, prompt: PROMPT, seed: 1, steps })).batches;
    const { layout } = model;
    const timer = StageTimer.get();
    timer.watch({ 'text encoders': [layout.textEncoder, layout.textEncoder2], denoiser: [layout.denoiser], 'VAE decoder': [layout.vaeDecoder], 'VAE encoder': [layout.vaeEncoder] });

    const runtime = new WorkerRuntime({ runtime: { ...defaultRuntime(), provider } });
    // The first run also compiles the GPU provider's kernels: it is not timed.
    await runtime.generateImages(batch);
    timer.take();
    const reps = steps * batch.width * batch.height <= 4 * 1024 * 1024 ? 5 : 1;
    const walls: number[] = [];
    let image: RgbImage | undefined;
    const totals: StageTotals[] = [];
    for (let i = 0; i < reps; i++) {
      walls.push(await timed(async () => ([image] = await runtime.generateImages(batch))));
      totals.push(timer.take());
    }
    // The rep whose wall time is the median stands for all (reps is odd: the median is one of them).
    const pick = walls.indexOf(median(walls));
    const t = totals[pick];
    const encoded: Uint8Array[] = [];
    const encodes: number[] = [];
    for (let i = 0; i < 3; i++) encodes.push(await timed(async () => encoded.push(await encodeImage(image!, 'png'))));
    const encodeMs = median(encodes);
    const ipcMs = await ipcTransferMs([encoded[0]]);
    const httpBody = { model: name, prompt: PROMPT, seed: 1, steps: 1, response_format: 'b64_json' };
    await bench.overHttp(httpBody);
    const http: number[] = [];
    for (let i = 0; i < (reps > 1 ? 5 : 1); i++) {
      const { ms: total, generateMs } = await bench.overHttp(httpBody);
      http.push(total - generateMs);
    }
    const httpMs = Math.max(0, median(http));

    const scale = preset.steps / steps;
    const component = (c: Component) => t.ort[c];
    const conversion = Object.values(t.conversion).reduce((a, b) => a + b, 0);
    const denoiserConversion = t.conversion.denoiser;
    const accounted = t.tokenize + component('text encoders') + component('denoiser') + component('VAE decoder') + component('VAE encoder') + conversion + t.vaeJs;
    // The loop's own work per step is the shortest gap between denoiser calls (a longer one waited for a
    // core); the rest of the remainder is paid once per image and is not scaled with the steps.
    const perStep = t.denoiserGaps.length ? Math.min(...t.denoiserGaps) : 0;
    const once = Math.max(0, walls[pick] - accounted - t.denoiserGaps.reduce((a, b) => a + b, 0));
    const otherJs = once + perStep * (preset.steps - 1);
    const stages: [string, number, boolean][] = [
      ['tokenize', t.tokenize, false],
      ['text encoders (onnxruntime)', component('text encoders'), true],
      ['denoiser (onnxruntime)', component('denoiser') * scale, true],
      ['tensor conversion (feeds, fp16)', conversion - denoiserConversion + denoiserConversion * scale, false],
      [`scheduler + other JS (${ms(perStep)}/step)`, otherJs, false],
      ['VAE decoder (onnxruntime)', component('VAE decoder'), true],
      ['VAE JS (scaling, to 8-bit)', t.vaeJs, false],
      ['PNG encode', encodeMs, false],
      ['IPC worker -> server', ipcMs, false],
      ['HTTP (b64_json)', httpMs, false],
    ];
    const total = stages.reduce((sum, [, value]) => sum + value, 0);
    const outside = stages.filter(([, , inOrt]) => !inOrt).reduce((sum, [, value]) => sum + value, 0);
    const where = `${name} ${batch.width}x${batch.height} ${preset.steps} steps${preset.steps > steps ? ` (timed at ${steps})` : ''}${provider === 'cpu' ? '' : ` on ${provider}`}`;
    const rows: Row[] = stages.map(([stage, value]) => ({ group: 'time per image', case: `${where}: ${stage}`, baseline: `image ${ms(total)}`, measured: ms(value), ratio: value / total }));
    rows.push({ group: 'outside onnxruntime', case: where, baseline: `image ${ms(total)}`, measured: ms(outside), ratio: outside / total, goal: '< 0.05', met: outside / total < 0.05 });
    return rows;
  } finally {
    await bench.close();
  }
}
