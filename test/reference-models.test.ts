import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { ort } from '../src/runtime/onnxruntime.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { presetOverrideSchema } from '../src/models/presets.js';
import { WorkerRuntime } from '../src/pipelines/run.js';
import { PRIOR_STRENGTH } from '../src/reference/concept-graph.js';
import {
  BACKGROUND,
  BANK_SIZE,
  buildDefaultModel,
  buildReferenceModels,
  COLOUR_NAMES,
  COLOURS,
  CONCEPTS,
  DEFAULT_MODEL_DIR,
  drawPrototype,
  latentCode,
  MASK_COUNT,
  PLACEMENTS,
  PROTOTYPE_IMAGE_SIZE,
  PROTOTYPES,
  prototypeBank,
  REFERENCE_FAMILIES,
  referenceClipVocabulary,
  referenceT5Vocabulary,
  sdSigmas,
  SHAPES,
  SYNONYMS,
  type ColourName,
  type ShapeName,
} from '../src/reference/index.js';
import { encodeImage } from '../src/reference/latent-code.js';
import { readPicture } from './helpers/picture.js';
import { referenceModel } from './helpers/reference.js';
import { largestDifference } from '../src/util/difference.js';

/** This file's own worker runtime, in this process. */
const runtime = new WorkerRuntime();

/**
 * The reference models: right files and tensor signatures for every family, byte-for-byte
 * reproducible, and the closed form each graph is meant to compute actually holds when run.
 */

/** Where the reproducibility tests build their own copies; the models under test come from the global setup. */
let root: string;
beforeAll(async () => {
  root = await mkdtemp(path.join(os.tmpdir(), 'imagegen-reference-test-'));
});
afterAll(async () => {
  await Promise.all([...sessions.values()].map(async (s) => (await s).release()));
  await rm(root, { recursive: true, force: true });
});

const modelDir = referenceModel;

async function listFiles(dir: string): Promise<string[]> {
  const entries = await readdir(dir, { recursive: true, withFileTypes: true });
  return entries
    .filter((e) => e.isFile())
    .map((e) => path.relative(dir, path.join(e.parentPath, e.name)))
    .sort();
}

async function expectSameFiles(a: string, b: string): Promise<void> {
  const files = await listFiles(a);
  expect(await listFiles(b)).toEqual(files);
  for (const file of files) {
    const [x, y] = await Promise.all([readFile(path.join(a, file)), readFile(path.join(b, file))]);
    expect(Buffer.compare(x, y), file).toBe(0);
  }
}

const readJson = async (family: string, file: string) => JSON.parse(await readFile(path.join(modelDir(family), file), 'utf8'));

const sessions = new Map<string, Promise<ort.InferenceSession>>();
function session(family: string, component: string): Promise<ort.InferenceSession> {
  const file = path.join(modelDir(family), component, 'model.onnx');
  if (!sessions.has(file)) sessions.set(file, ort.InferenceSession.create(file));
  return sessions.get(file)!;
}

// --- float16 and typed feeds, as a loader casts every feed to the type the graph declares ---

function toHalf(value: number): number {
  const f32 = new Float32Array([value]);
  const bits = new Uint32Array(f32.buffer)[0];
  const sign = (bits >>> 16) & 0x8000;
  const exponent = ((bits >>> 23) & 0xff) - 127 + 15;
  const mantissa = bits & 0x7fffff;
  if (exponent <= 0) return sign; // flush the (tiny) subnormals: not needed here
  if (exponent >= 31) return sign | 0x7c00;
  const rounded = (exponent << 10) | (mantissa >>> 13);
  return sign | (rounded + ((mantissa >>> 12) & 1));
}

function fromHalf(h: number): number {
  const exponent = (h >>> 10) & 0x1f;
  const mantissa = h & 0x3ff;
  const value = exponent === 0 ? mantissa * 2 ** -24 : (1 + mantissa / 1024) * 2 ** (exponent - 15);
  return h & 0x8000 ? -value : value;
}

function inputType(s: ort.InferenceSession, name: string): ort.Tensor.Type {
  const meta = s.inputMetadata.find((m) => m.name === name);
  if (!meta?.isTensor) throw new Error(`no tensor input ${name}`);
  return meta.type;
}

function feed(s: ort.InferenceSession, name: string, values: ArrayLike<number>, dims: number[]): ort.Tensor {
  const type = inputType(s, name);
  const list = Array.from(values);
  switch (type) {
    case 'float32':
      return new ort.Tensor(type, Float32Array.from(list), dims);
    case 'float16':
      return new ort.Tensor(type, Uint16Array.from(list.map(toHalf)), dims);
    case 'int64':
      return new ort.Tensor(type, BigInt64Array.from(list.map((v) => BigInt(Math.round(v)))), dims);
    case 'int32':
      return new ort.Tensor(type, Int32Array.from(list), dims);
    default:
      throw new Error(`unexpected input type ${type}`);
  }
}

function values(t: ort.Tensor): Float32Array {
  if (t.type === 'float16') return Float32Array.from(t.data as Uint16Array, fromHalf);
  return t.data as Float32Array;
}

/** A reproducible standard normal sequence (mulberry32 + Box-Muller). */
function gaussian(seed: number, n: number): Float32Array {
  let state = seed;
  const uniform = () => {
    state = (state + 0x6d2b79f5) | 0;
    let t = Math.imul(state ^ (state >>> 15), 1 | state);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return (((t ^ (t >>> 14)) >>> 0) + 0.5) / 2 ** 32;
  };
  return Float32Array.from({ length: n }, () => Math.sqrt(-2 * Math.log(uniform())) * Math.cos(2 * Math.PI * uniform()));
}

const prototypeIndex = (colour: ColourName, shape: ShapeName, placement: number) =>
  PROTOTYPES.findIndex((p) => p.colour === colour && p.shape === shape && p.placement === PLACEMENTS[placement]);

/** Prototype k's model-space latent [C, 32, 32]: its colour's code times its shape-placement's mask. */
function prototypeLatent(k: number, channels: number): Float32Array {
  const { colourCodes, masks } = prototypeBank(channels);
  const plane = BANK_SIZE * BANK_SIZE;
  const [colour, mask] = [Math.floor(k / MASK_COUNT), k % MASK_COUNT];
  const latent = new Float32Array(channels * plane);
  for (let c = 0; c < channels; c++) {
    for (let p = 0; p < plane; p++) latent[c * plane + p] = colourCodes[colour * channels + c] * masks[mask * plane + p];
  }
  return latent;
}

/**
 * The posterior mean sum_k w_k z_k over every prototype, one by one in float64, for a model-space
 * latent x [C, 32, 32] of a process x = signal z + noise of variance noiseVar, with the prompt's
 * concepts: what the graphs compute without ever forming the prototypes. Also returns the largest weight.
 */
function posteriorMean(x: Float32Array, channels: number, signal: number, noiseVar: number, prompt: readonly string[]): { mean: Float64Array; maxWeight: number } {
  const logits = PROTOTYPES.map((proto, k) => {
    const z = prototypeLatent(k, channels);
    let [dot, norm] = [0, 0];
    for (let j = 0; j < z.length; j++) {
      dot += x[j] * z[j];
      norm += z[j] * z[j];
    }
    const prior = PRIOR_STRENGTH * (Number(prompt.includes(proto.colour)) + Number(prompt.includes(proto.shape)));
    return prior + (signal * dot - (signal * signal * norm) / 2) / noiseVar;
  });
  const top = Math.max(...logits);
  const weights = logits.map((l) => Math.exp(l - top));
  const total = weights.reduce((a, b) => a + b, 0);
  const mean = new Float64Array(x.length);
  weights.forEach((w, k) => {
    if (w / total < 1e-12) return;
    const z = prototypeLatent(k, channels);
    for (let j = 0; j < z.length; j++) mean[j] += (w / total) * z[j];
  });
  return { mean, maxWeight: Math.max(...weights) / total };
}

// --- what each family's folder must hold ---

const CLIP_SLOW = ['merges.txt', 'special_tokens_map.json', 'tokenizer_config.json', 'vocab.json'];
const CLIP_BOTH = [...CLIP_SLOW, 'tokenizer.json'].sort();
const T5_FILES = ['special_tokens_map.json', 'tokenizer.json', 'tokenizer_config.json'];
const inDir = (dir: string, names: string[]) => names.map((n) => `${dir}/${n}`);
const optimumComponent = (dir: string, external = false) => inDir(dir, ['config.json', 'model.onnx', ...(external ? ['model.onnx_data'] : [])]);
const OPTIMUM_VAE = [...optimumComponent('vae_decoder'), ...optimumComponent('vae_encoder')];
const TOP = ['model_index.json', 'scheduler/scheduler_config.json'];
const SD_OPTIMUM_FILES = [...TOP, ...optimumComponent('text_encoder'), ...inDir('tokenizer', CLIP_BOTH), ...optimumComponent('unet', true), ...OPTIMUM_VAE];
const FLUX_FILES = [
  ...TOP,
  ...optimumComponent('text_encoder'),
  ...optimumComponent('text_encoder_2'),
  ...inDir('tokenizer', CLIP_BOTH),
  ...inDir('tokenizer_2', T5_FILES),
  ...optimumComponent('transformer', true),
  ...OPTIMUM_VAE,
];

const EXPECTED_FILES: Record<string, string[]> = {
  'sd15-legacy': [
    ...TOP,
    'text_encoder/model.onnx',
    ...inDir('tokenizer', CLIP_SLOW),
    'unet/model.onnx',
    'unet/weights.pb',
    'vae_decoder/model.onnx',
    'vae_encoder/model.onnx',
  ],
  'sd15-optimum': SD_OPTIMUM_FILES,
  'sd15-inpainting': SD_OPTIMUM_FILES,
  'sd15-fp16': SD_OPTIMUM_FILES,
  'sd2-v': SD_OPTIMUM_FILES,
  'sd-turbo': [...TOP, ...optimumComponent('text_encoder'), ...inDir('tokenizer', ['tokenizer.json', 'tokenizer_config.json']), ...optimumComponent('unet', true), ...OPTIMUM_VAE],
  sdxl: [
    ...TOP,
    ...optimumComponent('text_encoder'),
    ...optimumComponent('text_encoder_2'),
    ...inDir('tokenizer', CLIP_BOTH),
    ...inDir('tokenizer_2', CLIP_BOTH),
    ...optimumComponent('unet', true),
    ...OPTIMUM_VAE,
  ],
  lcm: SD_OPTIMUM_FILES,
  'flux-schnell': FLUX_FILES,
  'flux-dev': FLUX_FILES,
};

// --- tensor signatures: [name, type, rank] ---

type Signature = Array<[name: string, type: string, rank: number]>;
interface Component {
  inputs: Signature;
  outputs: Signature;
}

function clipSignature(ids: string, float: string, kind: 'plain' | 'sdxl-1' | 'sdxl-2' = 'plain'): Component {
  const hiddenStates: Signature = kind === 'plain' ? [] : [0, 1, 2].map((i) => [`hidden_states.${i}`, float, 3]);
  const main: Signature =
    kind === 'sdxl-2'
      ? [['text_embeds', float, 2], ['last_hidden_state', float, 3]]
      : [['last_hidden_state', float, 3], ['pooler_output', float, 2]];
  return { inputs: [['input_ids', ids, 2]], outputs: [...main, ...hiddenStates] };
}

function unetSignature(float: string, timestep: [string, number], extra: Signature = []): Component {
  return {
    inputs: [['sample', float, 4], ['timestep', ...timestep], ['encoder_hidden_states', float, 3], ...extra],
    outputs: [['out_sample', float, 4]],
  };
}

function vaeSignature(float: string, encoderOutput: string): Record<string, Component> {
  return {
    vae_decoder: { inputs: [['latent_sample', float, 4]], outputs: [['sample', float, 4]] },
    vae_encoder: { inputs: [['sample', float, 4]], outputs: [[encoderOutput, float, 4]] },
  };
}

function fluxSignature(guidance: boolean): Record<string, Component> {
  const inputs: Signature = [
    ['hidden_states', 'float32', 3],
    ['encoder_hidden_states', 'float32', 3],
    ['pooled_projections', 'float32', 2],
    ['timestep', 'float32', 1],
    ['img_ids', 'float32', 2],
    ['txt_ids', 'float32', 2],
  ];
  return {
    text_encoder: clipSignature('int64', 'float32'),
    text_encoder_2: { inputs: [['input_ids', 'int64', 2]], outputs: [['last_hidden_state', 'float32', 3]] },
    transformer: { inputs: guidance ? [...inputs, ['guidance', 'float32', 1]] : inputs, outputs: [['out_hidden_states', 'float32', 3]] },
    ...vaeSignature('float32', 'latent_parameters'),
  };
}

const sdOptimum = (float: string, timestep: [string, number], extra: Signature = []) => ({
  text_encoder: clipSignature('int64', float),
  unet: unetSignature(float, timestep, extra),
  ...vaeSignature(float, 'latent_parameters'),
});

const SIGNATURES: Record<string, Record<string, Component>> = {
  'sd15-legacy': {
    text_encoder: clipSignature('int32', 'float32'),
    unet: unetSignature('float32', ['float32', 1]),
    ...vaeSignature('float32', 'latent_sample'),
  },
  'sd15-optimum': sdOptimum('float32', ['float32', 0]),
  'sd15-inpainting': sdOptimum('float32', ['float32', 0]),
  'sd15-fp16': sdOptimum('float16', ['float16', 0]),
  'sd2-v': sdOptimum('float32', ['int64', 1]),
  'sd-turbo': sdOptimum('float32', ['float32', 0]),
  sdxl: {
    text_encoder: clipSignature('int64', 'float32', 'sdxl-1'),
    text_encoder_2: clipSignature('int64', 'float32', 'sdxl-2'),
    unet: unetSignature('float32', ['float32', 0], [['text_embeds', 'float32', 2], ['time_ids', 'float32', 2]]),
    ...vaeSignature('float32', 'latent_parameters'),
  },
  lcm: sdOptimum('float32', ['float32', 0], [['timestep_cond', 'float32', 2]]),
  'flux-schnell': fluxSignature(false),
  'flux-dev': fluxSignature(true),
};

function signatureOf(metadata: readonly ort.InferenceSession.ValueMetadata[]): Signature {
  return metadata.map((m) => {
    if (!m.isTensor) throw new Error(`${m.name} is not a tensor`);
    return [m.name, m.type, m.shape.length];
  });
}

describe('reference model folders', () => {
  it('builds every family', () => {
    expect(REFERENCE_FAMILIES).toEqual(Object.keys(EXPECTED_FILES));
  });

  for (const family of Object.keys(EXPECTED_FILES)) {
    it(`${family}: has the real export's files`, async () => {
      expect(await listFiles(modelDir(family))).toEqual([...EXPECTED_FILES[family]].sort());
    });

    it(`${family}: every ONNX graph has the real tensor names, dtypes and ranks`, async () => {
      for (const [component, expected] of Object.entries(SIGNATURES[family])) {
        const s = await session(family, component);
        expect({ component, inputs: signatureOf(s.inputMetadata), outputs: signatureOf(s.outputMetadata) }).toEqual({ component, ...expected });
      }
    });
  }

  it('keeps batch and spatial dims symbolic', async () => {
    const unet = await session('sdxl', 'unet');
    const sample = unet.inputMetadata.find((m) => m.name === 'sample');
    expect(sample?.isTensor && sample.shape).toEqual(['batch', 4, 'height', 'width']);
    const states = unet.inputMetadata.find((m) => m.name === 'encoder_hidden_states');
    expect(states?.isTensor && states.shape).toEqual(['batch', 'sequence', 48]);
    const transformer = await session('flux-dev', 'transformer');
    expect(transformer.inputMetadata.map((m) => m.isTensor && m.shape)).toEqual([
      ['batch', 'image_sequence', 64],
      ['batch', 'text_sequence', 32],
      ['batch', 16],
      ['batch'],
      ['image_sequence', 3],
      ['text_sequence', 3],
      ['batch'],
    ]);
  });

  it('is byte-for-byte reproducible', async () => {
    await buildReferenceModels(path.join(root, 'b'));
    for (const family of REFERENCE_FAMILIES) await expectSameFiles(modelDir(family), path.join(root, 'b', family));
  });

  it('has the committed embedded default equal to a fresh build', async () => {
    const fresh = path.join(root, 'default');
    await buildDefaultModel(fresh);
    await expectSameFiles(fresh, DEFAULT_MODEL_DIR);
    const files = await listFiles(fresh);
    expect(files.filter((f) => f !== 'README.md' && f !== 'imagegen.json')).toEqual([...EXPECTED_FILES['sd-turbo']].sort());
  });

  it('gives the demo model the preset the server reads: 4 steps and the sizes dall-e apps ask for', async () => {
    const preset = presetOverrideSchema.parse(JSON.parse(await readFile(path.join(DEFAULT_MODEL_DIR, 'imagegen.json'), 'utf8')));
    expect(preset.steps).toEqual({ standard: 4, hd: 8 });
    expect(preset.default_size).toBe('512x512');
    expect(preset.sizes).toEqual(expect.arrayContaining(['256x256', '512x512', '768x768', '1024x1024', '1792x1024', '1024x1792', '512x768', '768x512']));
  });

  it('keeps every family small', async () => {
    for (const family of REFERENCE_FAMILIES) {
      const files = await listFiles(modelDir(family));
      const sizes = await Promise.all(files.map(async (file) => (await readFile(path.join(modelDir(family), file))).length));
      expect(sizes.reduce((a, b) => a + b, 0), family).toBeLessThan(2 * 2 ** 20);
    }
  });
});

describe('the prototype bank', () => {
  it('has dozens of placements of every colour and shape, each inside the picture', () => {
    expect(PLACEMENTS.length).toBeGreaterThanOrEqual(60);
    expect(PROTOTYPES).toHaveLength(COLOUR_NAMES.length * SHAPES.length * PLACEMENTS.length);
    const { masks } = prototypeBank(4);
    const plane = BANK_SIZE * BANK_SIZE;
    for (let m = 0; m < MASK_COUNT; m++) {
      const mask = masks.subarray(m * plane, (m + 1) * plane);
      const edge = [...mask].filter((_, p) => [0, BANK_SIZE - 1].includes(p % BANK_SIZE) || [0, BANK_SIZE - 1].includes(Math.floor(p / BANK_SIZE)));
      expect(Math.max(...edge), `mask ${m}`).toBe(0);
    }
  });

  it('draws the shapes of one placement with the same area', () => {
    const plane = BANK_SIZE * BANK_SIZE;
    const { masks } = prototypeBank(4);
    const area = (m: number) => masks.subarray(m * plane, (m + 1) * plane).reduce((a, b) => a + b, 0);
    for (let placement = 0; placement < PLACEMENTS.length; placement++) {
      const [circle, square, triangle] = SHAPES.map((_, shape) => area(shape * PLACEMENTS.length + placement));
      expect(circle / square).toBeCloseTo(1, 1);
      expect(triangle / square).toBeCloseTo(1, 1);
    }
  });

  it('factorises exactly: colour code x mask is the VAE encoding of the drawn prototype', () => {
    // Every colour, shape and size, at placements all over the grids.
    for (let k = 0; k < PROTOTYPES.length; k += 37) {
      const image = drawPrototype(PROTOTYPES[k]);
      for (const channels of [4, 16]) {
        expect(largestDifference(encodeImage(image, PROTOTYPE_IMAGE_SIZE, PROTOTYPE_IMAGE_SIZE, channels), prototypeLatent(k, channels)), `prototype ${k}`).toBeLessThan(1e-5);
      }
    }
  });
});

describe('reference configs', () => {
  it('names the pipelines and components as the real exports do', async () => {
    const legacy = await readJson('sd15-legacy', 'model_index.json');
    expect(legacy._class_name).toBe('OnnxStableDiffusionPipeline');
    expect(legacy.vae_decoder).toEqual(['diffusers', 'OnnxRuntimeModel']);
    const optimum = await readJson('sd15-optimum', 'model_index.json');
    expect(optimum._class_name).toBe('StableDiffusionPipeline');
    expect(optimum.vae).toEqual(['diffusers', 'AutoencoderKL']);
    expect(optimum.vae_decoder).toBeUndefined();
    expect((await readJson('sdxl', 'model_index.json')).text_encoder_2).toEqual(['transformers', 'CLIPTextModelWithProjection']);
    expect((await readJson('flux-dev', 'model_index.json')).transformer).toEqual(['diffusers', 'FluxTransformer2DModel']);
    expect((await readJson('lcm', 'model_index.json'))._class_name).toBe('LatentConsistencyModelPipeline');
  });

  it('writes the schedulers of the real models', async () => {
    const scheduler = (family: string) => readJson(family, 'scheduler/scheduler_config.json');
    const sdBetas = { beta_start: 0.00085, beta_end: 0.012, beta_schedule: 'scaled_linear', num_train_timesteps: 1000 };
    expect(await scheduler('sd15-legacy')).toMatchObject({
      _class_name: 'PNDMScheduler',
      ...sdBetas,
      set_alpha_to_one: false,
      skip_prk_steps: true,
      steps_offset: 1,
      clip_sample: false,
    });
    expect(await scheduler('sd15-optimum')).toMatchObject({ _class_name: 'EulerDiscreteScheduler', ...sdBetas, timestep_spacing: 'leading', steps_offset: 1 });
    expect(await scheduler('sd2-v')).toMatchObject({
      _class_name: 'DDIMScheduler',
      prediction_type: 'v_prediction',
      steps_offset: 1,
      set_alpha_to_one: false,
      clip_sample: false,
      timestep_spacing: 'leading',
    });
    expect(await scheduler('sd-turbo')).toMatchObject({ _class_name: 'EulerAncestralDiscreteScheduler', timestep_spacing: 'trailing' });
    expect(await scheduler('sdxl')).toMatchObject({ _class_name: 'EulerDiscreteScheduler', timestep_spacing: 'leading', steps_offset: 1 });
    expect(await scheduler('lcm')).toMatchObject({ _class_name: 'LCMScheduler', original_inference_steps: 50 });
    expect(await scheduler('flux-schnell')).toMatchObject({ _class_name: 'FlowMatchEulerDiscreteScheduler', shift: 1, use_dynamic_shifting: false });
    expect(await scheduler('flux-dev')).toMatchObject({
      _class_name: 'FlowMatchEulerDiscreteScheduler',
      shift: 3,
      use_dynamic_shifting: true,
      base_shift: 0.5,
      max_shift: 1.15,
      base_image_seq_len: 256,
      max_image_seq_len: 4096,
    });
  });

  it('writes the component configs a pipeline reads', async () => {
    expect(await readJson('sd15-optimum', 'unet/config.json')).toMatchObject({ sample_size: 64, in_channels: 4, cross_attention_dim: 16 });
    // An inpainting UNet takes the mask and the masked picture's latents after the sample, as runwayml's does.
    expect(await readJson('sd15-inpainting', 'unet/config.json')).toMatchObject({ in_channels: 9, out_channels: 4 });
    expect(await readJson('sd15-inpainting', 'model_index.json')).toMatchObject({ _class_name: 'StableDiffusionInpaintPipeline' });
    expect(await readJson('sd15-optimum', 'vae_decoder/config.json')).toMatchObject({ scaling_factor: 0.18215, latent_channels: 4 });
    expect(await readJson('sd2-v', 'unet/config.json')).toMatchObject({ sample_size: 96 });
    expect(await readJson('sdxl', 'unet/config.json')).toMatchObject({ sample_size: 128, cross_attention_dim: 48 });
    expect(await readJson('sdxl', 'vae_decoder/config.json')).toMatchObject({ scaling_factor: 0.13025 });
    expect(await readJson('lcm', 'unet/config.json')).toMatchObject({ time_cond_proj_dim: 256 });
    expect(await readJson('flux-dev', 'vae_decoder/config.json')).toMatchObject({ scaling_factor: 0.3611, shift_factor: 0.1159, latent_channels: 16 });
    expect(await readJson('flux-dev', 'transformer/config.json')).toMatchObject({ in_channels: 64, guidance_embeds: true });
    expect(await readJson('flux-schnell', 'transformer/config.json')).toMatchObject({ guidance_embeds: false });
  });
});

describe('reference tokenizers', () => {
  const clip = referenceClipVocabulary();
  const t5 = referenceT5Vocabulary();

  it('lays out the CLIP vocabulary like the real one', async () => {
    const vocab: Record<string, number> = await readJson('sd15-optimum', 'tokenizer/vocab.json');
    expect(vocab['!']).toBe(0);
    expect(vocab['!</w>']).toBe(256);
    expect(vocab['<|startoftext|>']).toBe(clip.size - 2);
    expect(vocab['<|endoftext|>']).toBe(clip.size - 1);
    const merges = (await readFile(path.join(modelDir('sd15-optimum'), 'tokenizer/merges.txt'), 'utf8')).trimEnd().split('\n');
    expect(merges[0]).toBe('#version: 0.2');
    const fast = await readJson('sd15-optimum', 'tokenizer/tokenizer.json');
    expect(fast.model.vocab).toEqual(vocab);
    expect(fast.model.merges).toEqual(merges.slice(1));
    expect(fast.model.end_of_word_suffix).toBe('</w>');
  });

  it('makes every concept word one token and spells unknown words out', () => {
    const [bos, eos] = [clip.bosId, clip.eosId];
    expect(clip.encode('A  Red circle', eos).slice(0, 6)).toEqual([bos, clip.wordId('a'), clip.wordId('red'), clip.wordId('circle'), eos, eos]);
    const unknown = clip.encode('zebra', 0);
    expect(unknown.slice(0, 7)).toEqual([bos, ...'zebr'.split('').map((c) => clip.vocab.get(c)!), clip.vocab.get('a</w>')!, eos]);
    expect(unknown).toHaveLength(77);
  });

  it('pads with "!" or <|endoftext|> as the family does', async () => {
    expect((await readJson('sd15-legacy', 'tokenizer/tokenizer_config.json')).pad_token).toBe('<|endoftext|>');
    expect((await readJson('sd15-legacy', 'tokenizer/special_tokens_map.json')).pad_token).toBe('<|endoftext|>');
    expect((await readJson('sd2-v', 'tokenizer/tokenizer_config.json')).pad_token).toBe('!');
    expect((await readJson('sd-turbo', 'tokenizer/tokenizer_config.json')).pad_token).toBe('!');
    expect((await readJson('sdxl', 'tokenizer/tokenizer_config.json')).pad_token).toBe('<|endoftext|>');
    expect((await readJson('sdxl', 'tokenizer_2/tokenizer_config.json')).pad_token).toBe('!');
  });

  it('writes a T5 Unigram tokenizer that segments any text', async () => {
    const file = await readJson('flux-dev', 'tokenizer_2/tokenizer.json');
    expect(file.model.type).toBe('Unigram');
    expect(file.model.unk_id).toBe(2);
    expect(file.model.vocab.slice(0, 3).map(([piece]: [string]) => piece)).toEqual(['<pad>', '</s>', '<unk>']);
    expect(file.post_processor.single.at(-1)).toEqual({ SpecialToken: { id: '</s>', type_id: 0 } });
    expect((await readJson('flux-schnell', 'tokenizer_2/tokenizer_config.json')).model_max_length).toBe(256);
    expect((await readJson('flux-dev', 'tokenizer_2/tokenizer_config.json')).model_max_length).toBe(512);

    const piece = (p: string) => t5.idOf(p)!;
    expect(t5.encode('A red  Circle', 8)).toEqual([piece('▁A'), piece('▁red'), piece('▁Circle'), 1, 0, 0, 0, 0]);
    expect(t5.encode('xy', 5)).toEqual([piece('▁'), piece('x'), piece('y'), 1, 0]);
  });
});

describe('reference text encoders', () => {
  const clip = referenceClipVocabulary();
  const concept = (name: string) => CONCEPTS.indexOf(name as ColourName);

  it('pools the concepts a prompt mentions, synonyms included', async () => {
    const s = await session('sd15-legacy', 'text_encoder');
    const prompts = ['a red circle', 'two golden boxes', 'a cat'];
    const ids = prompts.flatMap((p) => clip.encode(p, clip.eosId));
    const out = await s.run({ input_ids: feed(s, 'input_ids', ids, [3, 77]) });
    const pooled = values(out.pooler_output);
    const hot = (row: number) => [...pooled.slice(row * 16, row * 16 + 16)].flatMap((v, d) => (v > 0.5 ? [d] : []));
    expect(hot(0)).toEqual([concept('red'), concept('circle')]);
    expect(SYNONYMS.golden).toBe('yellow');
    expect(hot(1)).toEqual([concept('yellow'), concept('square')]);
    expect(hot(2)).toEqual([]);
  });

  it('puts the true concept vectors only in the penultimate SDXL layer', async () => {
    const ids = clip.encode('a blue triangle', 0);
    for (const component of ['text_encoder', 'text_encoder_2']) {
      const s = await session('sdxl', component);
      const out = await s.run({ input_ids: feed(s, 'input_ids', ids, [1, 77]) });
      const hidden = component === 'text_encoder' ? 16 : 32;
      const blueToken = values(out['hidden_states.1']).slice(2 * hidden, 3 * hidden);
      expect(blueToken.indexOf(1)).toBe(concept('blue'));
      const scrambled = values(out.last_hidden_state).slice(2 * hidden, 3 * hidden);
      expect(scrambled.indexOf(1)).toBe(hidden - 1 - concept('blue'));
      expect(values(out['hidden_states.2'])).toEqual(values(out.last_hidden_state));
    }
  });
});

/** abar at timestep t (integer) of SD's schedule. */
function alphaBar(t: number): number {
  const sigma = sdSigmas()[t];
  return 1 / (1 + sigma * sigma);
}

/** The UNet prompt inputs the family's pipeline would build. */
async function unetPromptFeeds(family: string, unet: ort.InferenceSession, prompts: string[]): Promise<Record<string, ort.Tensor>> {
  const clip = referenceClipVocabulary();
  const b = prompts.length;
  const run = async (component: string, pad: number) => {
    const s = await session(family, component);
    return s.run({ input_ids: feed(s, 'input_ids', prompts.flatMap((p) => clip.encode(p, pad)), [b, 77]) });
  };
  if (family !== 'sdxl') {
    const pad = family === 'sd2-v' || family === 'sd-turbo' ? 0 : clip.eosId;
    const states = (await run('text_encoder', pad)).last_hidden_state;
    return { encoder_hidden_states: feed(unet, 'encoder_hidden_states', values(states), states.dims as number[]) };
  }
  const [first, second] = [await run('text_encoder', clip.eosId), await run('text_encoder_2', 0)];
  const [h1, h2] = [values(first['hidden_states.1']), values(second['hidden_states.1'])];
  const states = new Float32Array(b * 77 * 48);
  for (let row = 0; row < b * 77; row++) {
    states.set(h1.subarray(row * 16, row * 16 + 16), row * 48);
    states.set(h2.subarray(row * 32, row * 32 + 32), row * 48 + 16);
  }
  return {
    encoder_hidden_states: feed(unet, 'encoder_hidden_states', states, [b, 77, 48]),
    text_embeds: second.text_embeds,
    time_ids: feed(unet, 'time_ids', Array(b).fill([256, 256, 0, 0, 256, 256]).flat(), [b, 6]),
  };
}

describe('reference denoisers compute the exact posterior', () => {
  const unetFamilies = ['sd15-legacy', 'sd15-optimum', 'sd15-fp16', 'sd2-v', 'sd-turbo', 'sdxl', 'lcm'];
  const cases = [
    { prompt: 'a red circle', k: prototypeIndex('red', 'circle', 1) },
    { prompt: 'big blue square', k: prototypeIndex('blue', 'square', 0) },
  ];

  for (const family of unetFamilies) {
    it(`${family}: a noised prototype with its prompt gives back its noise`, async () => {
      const unet = await session(family, 'unet');
      const timestepMeta = unet.inputMetadata.find((m) => m.name === 'timestep');
      const perItem = timestepMeta?.isTensor && timestepMeta.shape.length === 1;
      // Noise levels at which the posterior has settled on the noised prototype: neighbouring
      // placements are only a few latent pixels apart, so at t = 500 it still hesitates between them.
      const timesteps = perItem ? [300, 200] : [300, 300];
      const d = 4 * BANK_SIZE * BANK_SIZE;
      const eps = gaussian(7, 2 * d);
      const x = new Float32Array(2 * d);
      const clean = new Float32Array(2 * d);
      cases.forEach(({ k }, i) => {
        const a = alphaBar(timesteps[i]);
        clean.set(prototypeLatent(k, 4), i * d);
        for (let j = i * d; j < (i + 1) * d; j++) x[j] = Math.sqrt(a) * clean[j] + Math.sqrt(1 - a) * eps[j];
      });
      const feeds: Record<string, ort.Tensor> = {
        sample: feed(unet, 'sample', x, [2, 4, BANK_SIZE, BANK_SIZE]),
        timestep: feed(unet, 'timestep', perItem ? timesteps : [300], perItem ? [2] : []),
        ...(await unetPromptFeeds(family, unet, cases.map((c) => c.prompt))),
      };
      if (family === 'lcm') feeds.timestep_cond = feed(unet, 'timestep_cond', new Float32Array(2 * 256), [2, 256]);
      const out = values((await unet.run(feeds)).out_sample);

      const expected = new Float32Array(2 * d);
      cases.forEach((_, i) => {
        const a = alphaBar(timesteps[i]);
        for (let j = i * d; j < (i + 1) * d; j++) {
          expected[j] = family === 'sd2-v' ? Math.sqrt(a) * eps[j] - Math.sqrt(1 - a) * clean[j] : eps[j];
        }
      });
      expect(largestDifference(out, expected)).toBeLessThan(family === 'sd15-fp16' ? 1e-2 : 1e-3);
    });
  }

  it('follows the prompt from pure noise, and runs at any size', async () => {
    const unet = await session('sd15-optimum', 'unet');
    const [h, w] = [24, 40];
    const d = 4 * h * w;
    const prompts = ['a red circle', 'a blue square', ''];
    const x = gaussian(11, 3 * d);
    const a = alphaBar(999);
    const out = values(
      (
        await unet.run({
          sample: feed(unet, 'sample', x, [3, 4, h, w]),
          timestep: feed(unet, 'timestep', [999], []),
          ...(await unetPromptFeeds('sd15-optimum', unet, prompts)),
        })
      ).out_sample,
    );
    // The model's clean estimate z_hat = (x - sqrt(1-a) eps) / sqrt(a), decoded to RGB by M^T.
    const m = latentCode(4);
    const meanColour = (item: number) => {
      const rgb = [0, 0, 0];
      for (let p = 0; p < h * w; p++) {
        for (let c = 0; c < 4; c++) {
          const j = item * d + c * h * w + p;
          const z = (x[j] - Math.sqrt(1 - a) * out[j]) / Math.sqrt(a);
          for (let k = 0; k < 3; k++) rgb[k] += m[c * 3 + k] * z;
        }
      }
      return rgb;
    };
    const [red, blue] = [meanColour(0), meanColour(1)];
    expect(red[0]).toBeGreaterThan(Math.max(red[1], red[2]));
    expect(blue[2]).toBeGreaterThan(Math.max(blue[0], blue[1]));
  });

  it('sd15-optimum: matches the posterior mean over every prototype where the posterior is still spread', async () => {
    const unet = await session('sd15-optimum', 'unet');
    const t = 800;
    const a = alphaBar(t);
    const d = 4 * BANK_SIZE * BANK_SIZE;
    const prompts = ['a red circle', ''];
    const clean = prototypeLatent(prototypeIndex('red', 'circle', 4), 4);
    const x = gaussian(5, 2 * d).map((e, j) => Math.sqrt(a) * clean[j % d] + Math.sqrt(1 - a) * e);
    const out = values(
      (
        await unet.run({
          sample: feed(unet, 'sample', x, [2, 4, BANK_SIZE, BANK_SIZE]),
          timestep: feed(unet, 'timestep', [t], []),
          ...(await unetPromptFeeds('sd15-optimum', unet, prompts)),
        })
      ).out_sample,
    );
    prompts.forEach((prompt, i) => {
      const item = x.subarray(i * d, (i + 1) * d);
      const { mean, maxWeight } = posteriorMean(item, 4, Math.sqrt(a), 1 - a, prompt.split(' '));
      // A blend of many prototypes: every weight and the ordering of k count, not only the best match.
      expect(maxWeight).toBeLessThan(0.5);
      const eps = item.map((v, j) => (v - Math.sqrt(a) * mean[j]) / Math.sqrt(1 - a));
      expect(largestDifference(out.subarray(i * d, (i + 1) * d), eps)).toBeLessThan(1e-3);
    });
  });

  /** Packs a [16, 32, 32] latent as the FLUX pipeline does: token i * 16 + j, feature c * 4 + dy * 2 + dx. */
  function pack(latent: ArrayLike<number>): Float32Array {
    const grid = BANK_SIZE / 2;
    const packed = new Float32Array(grid * grid * 64);
    for (let i = 0; i < grid; i++)
      for (let j = 0; j < grid; j++)
        for (let c = 0; c < 16; c++)
          for (let dy = 0; dy < 2; dy++)
            for (let dx = 0; dx < 2; dx++) packed[(i * grid + j) * 64 + c * 4 + dy * 2 + dx] = latent[(c * BANK_SIZE + 2 * i + dy) * BANK_SIZE + 2 * j + dx];
    return packed;
  }

  /** Runs the transformer on a packed 32x32 latent at sigma `s` with the prompt, as the pipeline calls it. */
  async function fluxVelocity(family: string, prompt: string, x: Float32Array, s: number): Promise<Float32Array> {
    const clip = referenceClipVocabulary();
    const t5 = referenceT5Vocabulary();
    const maxLength = family === 'flux-dev' ? 512 : 256;
    const [encoder, encoder2, transformer] = await Promise.all(['text_encoder', 'text_encoder_2', 'transformer'].map((c) => session(family, c)));
    const pooled = (await encoder.run({ input_ids: feed(encoder, 'input_ids', clip.encode(prompt, clip.eosId), [1, 77]) })).pooler_output;
    const text = (await encoder2.run({ input_ids: feed(encoder2, 'input_ids', t5.encode(prompt, maxLength), [1, maxLength]) })).last_hidden_state;
    const grid = BANK_SIZE / 2;
    const sequence = grid * grid;
    const imageIds = new Float32Array(sequence * 3);
    for (let i = 0; i < grid; i++) for (let j = 0; j < grid; j++) imageIds.set([0, i, j], (i * grid + j) * 3);
    const feeds: Record<string, ort.Tensor> = {
      hidden_states: feed(transformer, 'hidden_states', x, [1, sequence, 64]),
      encoder_hidden_states: text,
      pooled_projections: pooled,
      timestep: feed(transformer, 'timestep', [s], [1]),
      img_ids: feed(transformer, 'img_ids', imageIds, [sequence, 3]),
      txt_ids: feed(transformer, 'txt_ids', new Float32Array(maxLength * 3), [maxLength, 3]),
    };
    if (family === 'flux-dev') feeds.guidance = feed(transformer, 'guidance', [3.5], [1]);
    return values((await transformer.run(feeds)).out_hidden_states);
  }

  for (const family of ['flux-schnell', 'flux-dev']) {
    it(`${family}: a noised prototype, packed 2x2 as the pipeline packs, gives back its velocity`, async () => {
      const packed = pack(prototypeLatent(prototypeIndex('orange', 'triangle', 2), 16));
      // Low enough that the posterior has settled on this prototype rather than its neighbours.
      const s = 0.4;
      const eps = gaussian(3, packed.length);
      const velocity = await fluxVelocity(family, 'an orange triangle', packed.map((z, j) => (1 - s) * z + s * eps[j]), s);
      expect(largestDifference(velocity, eps.map((e, j) => e - packed[j]))).toBeLessThan(1e-3);
    });
  }

  it('flux-schnell: matches the posterior mean over every prototype on the packed sequence', async () => {
    const s = 0.85;
    const clean = prototypeLatent(prototypeIndex('orange', 'triangle', 10), 16);
    const x = gaussian(9, clean.length).map((e, j) => (1 - s) * clean[j] + s * e);
    const { mean, maxWeight } = posteriorMean(x, 16, 1 - s, s * s, ['orange', 'triangle']);
    expect(maxWeight).toBeLessThan(0.5);
    const velocity = await fluxVelocity('flux-schnell', 'an orange triangle', pack(x), s);
    expect(largestDifference(velocity, pack(x.map((v, j) => (v - mean[j]) / s)))).toBeLessThan(1e-3);
  });
});

describe('reference VAEs', () => {
  const families = [
    { family: 'sd15-legacy', channels: 4, scaling: 0.18215, shift: 0, encoderOutput: 'latent_sample' },
    { family: 'sd15-fp16', channels: 4, scaling: 0.18215, shift: 0, encoderOutput: 'latent_parameters' },
    { family: 'sdxl', channels: 4, scaling: 0.13025, shift: 0, encoderOutput: 'latent_parameters' },
    { family: 'flux-dev', channels: 16, scaling: 0.3611, shift: 0.1159, encoderOutput: 'latent_parameters' },
  ];
  const k = prototypeIndex('purple', 'circle', 0);
  const size = PROTOTYPE_IMAGE_SIZE;

  /** Mean RGB (0..1) of the pixels that differ from the background, and of those that do not. */
  function colours(image: Float32Array): { figure: number[]; background: number[] } {
    const plane = size * size;
    const sums = { figure: [0, 0, 0, 0], background: [0, 0, 0, 0] };
    for (let p = 0; p < plane; p++) {
      const rgb = [0, 1, 2].map((c) => image[c * plane + p] / 2 + 0.5);
      const target = Math.hypot(...rgb.map((v, c) => v - BACKGROUND[c])) > 0.2 ? sums.figure : sums.background;
      rgb.forEach((v, c) => (target[c] += v));
      target[3]++;
    }
    const mean = (s: number[]) => s.slice(0, 3).map((v) => v / s[3]);
    return { figure: mean(sums.figure), background: mean(sums.background) };
  }

  for (const { family, channels, scaling, shift, encoderOutput } of families) {
    it(`${family}: decodes a prototype to its colour and encodes it back`, async () => {
      const decoder = await session(family, 'vae_decoder');
      const latent = prototypeLatent(k, channels);
      // What pipelines send: latents / scaling_factor (+ shift_factor).
      const sent = latent.map((z) => z / scaling + shift);
      const image = values((await decoder.run({ latent_sample: feed(decoder, 'latent_sample', sent, [1, channels, BANK_SIZE, BANK_SIZE]) })).sample);
      expect(image.length).toBe(3 * size * size);
      const { figure, background } = colours(image);
      expect(largestDifference(figure, COLOURS.purple)).toBeLessThan(0.06);
      expect(largestDifference(background, BACKGROUND)).toBeLessThan(0.01);

      // Forgetting the scaling factor washes the colours out towards grey.
      const unscaled = values((await decoder.run({ latent_sample: feed(decoder, 'latent_sample', latent.map((z) => z + shift), [1, channels, BANK_SIZE, BANK_SIZE]) })).sample);
      expect(largestDifference(unscaled, new Float32Array(unscaled.length))).toBeLessThan(0.4);

      const encoder = await session(family, 'vae_encoder');
      const drawn = drawPrototype(PROTOTYPES[k]).map((v) => 2 * v - 1);
      const encoded = values((await encoder.run({ sample: feed(encoder, 'sample', drawn, [1, 3, size, size]) }))[encoderOutput]);
      const plane = channels * BANK_SIZE * BANK_SIZE;
      const mean = encoded.slice(0, plane).map((u) => (u - shift) * scaling);
      expect(largestDifference(mean, latent)).toBeLessThan(family === 'sd15-fp16' ? 5e-3 : 1e-5);
      if (encoderOutput === 'latent_parameters') expect(encoded.slice(plane).every((logVariance) => logVariance <= -29)).toBe(true);
    });
  }
});

describe('different seeds give different pictures', () => {
  it('sd-turbo: 8 seeds of "a red circle" at 256x256 in 4 steps give at least 6 distinct pictures', async () => {
    // Seeds far apart: the noise streams of nearby seeds overlap (seed s + 2 draws the noise of seed s
    // shifted by one pair), which shifts the picture rather than changing it.
    const seeds = [7, 271_828, 314_159, 1_618_033, 2_718_281, 4_242_424, 8_675_309, 31_415_926];
    const items = seeds.map((seed) => ({ prompt: 'a red circle', negativePrompt: '', seed }));
    const images = await runtime.generateImages({ modelDir: modelDir('sd-turbo'), width: 256, height: 256, steps: 4, guidanceScale: 0, items });
    for (const image of images) expect(readPicture(image.pixels, image.width, image.height)).toMatchObject({ colour: 'red', shape: 'circle' });
    // Two runs that land on the same prototype agree to a few levels; two placements differ far more somewhere.
    const distinct: Uint8Array[] = [];
    for (const { pixels } of images) if (distinct.every((other) => largestDifference(other, pixels) > 64)) distinct.push(pixels);
    expect(distinct.length).toBeGreaterThanOrEqual(6);
  });
});
