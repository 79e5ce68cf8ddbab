import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmod, cp, mkdir, mkdtemp, readdir, readFile, rm, stat, symlink, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import onnxProto from 'onnx-proto';
import type { onnx as proto } from 'onnx-proto';
import { ort } from '../src/runtime/onnxruntime.js';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { float32ToHalf, halfToFloat32 } from '../src/runtime/float16.js';
import type { WorkerRuntime } from '../src/pipelines/run.js';
import { readGolden, verifyCase } from '../src/cli/golden.js';
import { FP16_TOLERANCE } from '../src/cli/tolerance.js';
import { convertOnnxBytesToFloat16 } from '../scripts/fp16/convert.js';
import { convertFolderToFloat16, type ConvertedComponent } from '../scripts/fp16/convert-folder.js';
import { exportsRuntime, goldenFile, GOLDENS, haveRealExports, realExport, REAL_EXPORT_TIMEOUT_MS, skipCalibration, type RealExportName } from './helpers/real-exports.js';
import { largestDifference } from '../src/util/difference.js';
import { moveWeightsOut } from './helpers/external-data.js';

const { onnx } = onnxProto;
const { FLOAT, FLOAT16 } = onnx.TensorProto.DataType;

/**
 * float16 conversions of the real-architecture exports (scripts/fp16, as `optimum-cli export onnx
 * --fp16` makes them: float16 weights, inputs and outputs, integer ids untouched) against the float32
 * goldens of diffusers, at the looser FP16_TOLERANCE; a deliberate mistake must still fail it.
 *
 * Which cases: both of sd15 (the README's fp16 claim); of the others only case 1 (512x512, 768x512 and
 * 768x512: the same graphs and code paths as case 0 at 768x768 and 1024x1024, FLUX's T5, transformer
 * and the Loop and sequence ops of its position embedding included). Case 0 would triple this file's
 * time: float16 on the CPU is slower than float32, and the VAEs' decode grows faster than the pixels.
 */
const COVERED: readonly { name: RealExportName; cases: readonly number[] }[] = [
  { name: 'sd15', cases: [0, 1] },
  { name: 'sd2v', cases: [1] },
  { name: 'sdxl', cases: [1] },
  { name: 'flux', cases: [1] },
];

// One model loaded at a time, as in real-exports.test.ts: the arenas keep each model's peak activations.
// The conversions are not calibrated as they load (skipCalibration), as there: on the CPU, a float16
// export's calibration runs took up to 8 s (SDXL's) of what its one case takes.
let runtime: WorkerRuntime;
beforeAll(() => {
  runtime = exportsRuntime();
});

const TYPE_NAMES: Record<number, string> = { [FLOAT]: 'float32', [FLOAT16]: 'float16', [onnx.TensorProto.DataType.INT64]: 'int64' };

interface GraphTypes {
  /** How many initializers of each element type. */
  initializers: Record<number, number>;
  float32Constants: number;
  inputs: Record<string, string>;
  outputs: Record<string, string>;
}

/** Element types as a graph file declares them. */
async function graphTypes(file: string): Promise<GraphTypes> {
  const graph = onnx.ModelProto.decode(await readFile(file)).graph!;
  const initializers: Record<number, number> = {};
  for (const t of graph.initializer!) initializers[t.dataType!] = (initializers[t.dataType!] ?? 0) + 1;
  const float32Constants = graph.node!.filter((n) => n.opType === 'Constant' && n.attribute!.some((a) => a.t?.dataType === FLOAT)).length;
  const types = (values: proto.IValueInfoProto[]) => Object.fromEntries(values.map((v) => [v.name!, TYPE_NAMES[v.type!.tensorType!.elemType!]]));
  return { initializers, float32Constants, inputs: types(graph.input!), outputs: types(graph.output!) };
}

/** Input and output element types as onnxruntime sees them. */
async function sessionTypes(file: string): Promise<Pick<GraphTypes, 'inputs' | 'outputs'>> {
  const session = await ort.InferenceSession.create(file);
  const types = (metadata: readonly ort.InferenceSession.ValueMetadata[]) =>
    Object.fromEntries(metadata.map((m) => [m.name, m.isTensor ? m.type : 'not a tensor']));
  const result = { inputs: types(session.inputMetadata), outputs: types(session.outputMetadata) };
  await session.release();
  return result;
}

const asFloat16 = (types: Record<string, string>) => Object.fromEntries(Object.entries(types).map(([k, v]) => [k, v === 'float32' ? 'float16' : v]));

describe.skipIf(!haveRealExports)('float16 conversions of the real exports against diffusers (needs ../shared/data/real-exports)', { timeout: REAL_EXPORT_TIMEOUT_MS }, () => {
  let root: string;
  const converted = new Map<RealExportName, ConvertedComponent[]>();
  const fp16Dir = (name: RealExportName) => path.join(root, name);

  beforeAll(async () => {
    root = await mkdtemp(path.join(os.tmpdir(), 'imagegen-fp16-'));
    for (const { name } of COVERED) converted.set(name, await convertFolderToFloat16(realExport(name), fp16Dir(name)));
    skipCalibration(runtime, ...COVERED.map(({ name }) => fp16Dir(name)));
  });
  afterAll(() => rm(root, { recursive: true, force: true }));

  it('converts every component to float16: weights, Constants, float inputs and outputs; integer ids stay', async () => {
    for (const { name } of COVERED) {
      const components = converted.get(name)!;
      expect(components.length).toBeGreaterThanOrEqual(4);
      for (const { file } of components) {
        const before = await graphTypes(path.join(realExport(name), file));
        expect(before.initializers[FLOAT]).toBeGreaterThan(0);
        const fp16 = path.join(fp16Dir(name), file);
        expect({ file, ...(await graphTypes(fp16)) }).toEqual({
          file,
          initializers: { ...before.initializers, [FLOAT]: undefined, [FLOAT16]: before.initializers[FLOAT] },
          float32Constants: 0,
          inputs: asFloat16(before.inputs),
          outputs: asFloat16(before.outputs),
        });
        // onnxruntime agrees. Not for the sd2v and sdxl UNets: a float16 UNet takes 2.5-3 s to load here,
        // and sd15's stands for them.
        if (name === 'sd15' || name === 'flux') {
          expect({ file, ...(await sessionTypes(fp16)) }).toEqual({ file, inputs: asFloat16(before.inputs), outputs: asFloat16(before.outputs) });
        }
      }
    }
    // The ids really were left alone (the rule above would pass a graph with no integer inputs).
    expect((await sessionTypes(path.join(fp16Dir('flux'), 'transformer/model.onnx'))).inputs).toMatchObject({ img_ids: 'int64', txt_ids: 'int64', hidden_states: 'float16' });
  });

  // Before the cases below, whose first (sd15) then finds its float16 sessions loaded (one model at a time).
  it('fails a case when the guidance is off by 0.5', async () => {
    const [c] = await readGolden(goldenFile('sd15'));
    const result = await verifyCase(runtime, fp16Dir('sd15'), GOLDENS, { ...c, guidance: c.guidance + 0.5 }, 0, FP16_TOLERANCE);
    expect(result.pass).toBe(false);
    expect(result.maxAbs).toBeGreaterThan(FP16_TOLERANCE);
  });

  for (const { name, cases } of COVERED) {
    it(`${name}: golden case(s) ${cases.join(', ')} match diffusers to within ${(FP16_TOLERANCE * 255).toFixed(1)}/255`, async () => {
      const golden = await readGolden(goldenFile(name));
      for (const index of cases) {
        const r = await verifyCase(runtime, fp16Dir(name), GOLDENS, golden[index], index, FP16_TOLERANCE);
        expect({ case: index, maxAbs: r.maxAbs, pass: r.pass }).toEqual({ case: index, maxAbs: r.maxAbs, pass: true });
      }
    });
  }

  it('keeps block-listed ops in float32 between Casts, and the graph still computes the same', async () => {
    const source = path.join(realExport('sd15'), 'vae_decoder/model.onnx');
    const bytes = convertOnnxBytesToFloat16(await readFile(source), { blockList: new Set(['InstanceNormalization']) });
    const graph = onnx.ModelProto.decode(bytes).graph!;
    const producer = new Map(graph.node!.flatMap((n) => n.output!.map((o): [string, proto.INodeProto] => [o, n])));
    const castTo = (n: proto.INodeProto | undefined) => (n?.opType === 'Cast' ? Number(n.attribute![0].i) : undefined);
    const norms = graph.node!.filter((n) => n.opType === 'InstanceNormalization');
    expect(norms.length).toBeGreaterThan(0);
    for (const norm of norms) {
      // input, scale and bias are float16 values (or Constants) cast to float32 just for this node.
      expect(norm.input!.map((i) => castTo(producer.get(i)))).toEqual([FLOAT, FLOAT, FLOAT]);
      const [out] = norm.output!;
      expect(graph.node!.filter((n) => n.input!.includes(out)).map((n) => castTo(n))).toEqual([FLOAT16]);
    }

    // A decode of the same latents: float32, float16, float16 with the norms in float32.
    const latents = new ort.Tensor('float32', Float32Array.from({ length: 4 * 8 * 8 }, (_, i) => Math.sin(i * 0.37)), [1, 4, 8, 8]);
    const decode = async (model: string | Uint8Array, feed: ort.Tensor): Promise<Float32Array> => {
      const session = typeof model === 'string' ? await ort.InferenceSession.create(model) : await ort.InferenceSession.create(model);
      const out = (await session.run({ latent_sample: feed })).sample;
      await session.release();
      return out.type === 'float16' ? halfToFloat32(out.data as Uint16Array) : (out.data as Float32Array);
    };
    const halfLatents = new ort.Tensor('float16', float32ToHalf(latents.data as Float32Array), latents.dims);
    const reference = await decode(source, latents);
    const blocked = await decode(bytes, halfLatents);
    const plain = await decode(path.join(fp16Dir('sd15'), 'vae_decoder/model.onnx'), halfLatents);
    const range = reference.reduce((m, x) => Math.max(m, Math.abs(x)), 0);
    expect(largestDifference(blocked, reference) / range).toBeLessThan(0.01);
    expect(largestDifference(blocked, plain) / range).toBeLessThan(0.01);
  });

  it("converts an export whose weights lie beside its graphs (Optimum's model.onnx_data, as for every real UNet over 2 GB) into float16 weights files of its own", async () => {
    const external = await mkdtemp(path.join(os.tmpdir(), 'imagegen-external-'));
    onTestFinished(() => rm(external, { recursive: true, force: true }));
    const [source, target] = [path.join(external, 'fp32'), path.join(external, 'fp16')];
    await cp(realExport('sd15'), source, { recursive: true });
    await chmod(source, 0o755);
    const graphs = (await readdir(source, { recursive: true })).filter((file) => file.endsWith('.onnx'));
    for (const file of graphs) {
      const dir = path.dirname(path.join(source, file));
      await chmod(dir, 0o755);
      await chmod(path.join(source, file), 0o644);
      const model = onnx.ModelProto.decode(await readFile(path.join(source, file)));
      await writeFile(path.join(dir, 'model.onnx_data'), moveWeightsOut(model));
      await writeFile(path.join(source, file), onnx.ModelProto.encode(model).finish());
    }

    await convertFolderToFloat16(source, target);
    for (const file of graphs) {
      // The same float16 numbers as the conversion of the inline export, now in the graph's own file
      // (half the float32 one's size: the float32 weights are not copied).
      const ours = await initializerBytes(path.join(target, file));
      expect(ours.external).toBeGreaterThan(0);
      expect(Object.fromEntries(ours.bytes)).toEqual(Object.fromEntries((await initializerBytes(path.join(fp16Dir('sd15'), file))).bytes));
      const [fp32Size, fp16Size] = await Promise.all([source, target].map(async (root) => (await stat(path.join(root, path.dirname(file), 'model.onnx_data'))).size));
      expect(fp16Size).toBeLessThan(fp32Size * 0.55);
    }
    // onnxruntime reads a graph with them (a wrong offset or length fails its load); the UNet, the
    // component real exports keep outside, stands for the others (a float16 UNet takes seconds to load).
    const { inputs, outputs } = await graphTypes(path.join(target, 'unet/model.onnx'));
    expect(await sessionTypes(path.join(target, 'unet/model.onnx'))).toEqual({ inputs, outputs });
  });
});

describe.skipIf(!haveRealExports)('float16 conversion of a folder of links (needs ../shared/data/real-exports)', () => {
  it("converts one whose files are links (as a snapshot in Hugging Face's cache is), and refuses one with no graph", async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-links-'));
    onTestFinished(() => rm(dir, { recursive: true, force: true }));
    const [snapshot, plain, linked] = ['snapshot', 'plain', 'linked'].map((name) => path.join(dir, name));
    const files = (await readdir(realExport('sd15'), { recursive: true, withFileTypes: true })).filter((entry) => entry.isFile());
    for (const entry of files) {
      const link = path.join(snapshot, path.relative(realExport('sd15'), entry.parentPath), entry.name);
      await mkdir(path.dirname(link), { recursive: true });
      await symlink(path.join(entry.parentPath, entry.name), link);
    }

    const graphs = (await convertFolderToFloat16(realExport('sd15'), plain)).map((c) => c.file);
    expect((await convertFolderToFloat16(snapshot, linked)).map((c) => c.file).sort()).toEqual(graphs.sort());
    expect((await readdir(linked, { recursive: true })).sort()).toEqual((await readdir(plain, { recursive: true })).sort());
    // A folder without a graph (the wrong level of a download) is an error, not an empty conversion.
    await expect(convertFolderToFloat16(path.join(snapshot, 'tokenizer'), path.join(dir, 'none'))).rejects.toThrow(/holds no \.onnx graph/);
  });
});

describe('npm run convert:fp16', () => {
  it('says in a line what went wrong, exit 1, for a folder that is not there (not a stack trace)', () => {
    const missing = path.join(os.tmpdir(), 'imagegen-no-such-export');
    const run = spawnSync(process.execPath, ['--import', 'tsx', 'scripts/convert-fp16.ts', missing, path.join(os.tmpdir(), 'imagegen-fp16-out')], { encoding: 'utf8' });
    expect(run.status).toBe(1);
    const said = run.stderr.trim();
    expect(said).toMatch(/^convert-fp16: ENOENT: no such file or directory, \w+ '/);
    expect(said.endsWith(`'${missing}'`)).toBe(true);
  });
});

/** Each initializer's numbers by name (their sha256), read from the graph or from its external file; and how many were external. */
async function initializerBytes(onnxFile: string): Promise<{ bytes: Map<string, string>; external: number }> {
  const graph = onnx.ModelProto.decode(await readFile(onnxFile)).graph!;
  const bytes = new Map<string, string>();
  const digest = (data: Uint8Array) => createHash('sha256').update(data).digest('hex');
  const files = new Map<string, Buffer>();
  let external = 0;
  for (const tensor of graph.initializer!) {
    const entries = new Map(tensor.externalData!.map((e) => [e.key!, e.value!]));
    const location = entries.get('location');
    if (location === undefined) {
      bytes.set(tensor.name!, digest(tensor.rawData!));
      continue;
    }
    external++;
    if (!files.has(location)) files.set(location, await readFile(path.join(path.dirname(onnxFile), location)));
    const data = files.get(location)!;
    const offset = Number(entries.get('offset'));
    bytes.set(tensor.name!, digest(data.subarray(offset, offset + Number(entries.get('length')))));
  }
  return { bytes, external };
}
