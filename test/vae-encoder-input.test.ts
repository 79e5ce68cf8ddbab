import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { inpaintingChannels } from '../src/pipelines/inpainting-input.js';
import { VaeEncoder } from '../src/pipelines/vae.js';
import { Graph } from '../src/reference/onnx-graph.js';
import { OnnxModel } from '../src/runtime/onnx-model.js';
import { BatchNoise } from '../src/runtime/random.js';

/**
 * What the VAE encoder reads: the picture as diffusers' VaeImageProcessor hands it over, and the
 * masked picture an inpainting UNet is given. A real ONNX encoder that passes its input through
 * (latent_sample = sample) shows the tensor VaeEncoder feeds it.
 */

const [W, H] = [4, 2];
let dir: string;
let encoder: VaeEncoder;

beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-vae-input-'));
  const g = new Graph('pass_through_encoder');
  const sample = g.input('sample', 'float32', ['batch', 3, 'height', 'width']);
  g.output('latent_sample', g.op('Identity', [sample]), 'float32', ['batch', 3, 'height', 'width']);
  const file = path.join(dir, 'model.onnx');
  await writeFile(file, g.encode().model);
  // Scaling 1 and shift 0: the latents are the encoder's input itself.
  encoder = new VaeEncoder(await OnnxModel.load(file, { provider: 'cpu', threads: 1 }), 1, 0);
});

afterAll(async () => {
  await encoder?.release();
  await rm(dir, { recursive: true, force: true });
});

/** diffusers: numpy's float32 p / 255, then torch's float32 2 x - 1, each rounded to float32. */
const diffusersSigned = (p: number) => Math.fround(2 * Math.fround(Math.fround(p) / 255) - 1);

describe('the picture the VAE encoder reads', () => {
  it("is diffusers' 2 x (p / 255) - 1 in float32, to the last bit, for every byte", async () => {
    const bytes = Uint8Array.from({ length: 256 }, (_, i) => i);
    // 256 bytes as an 86x1 picture of three channels (the last two bytes padding).
    const pixels = new Uint8Array(86 * 3);
    pixels.set(bytes);
    const out = await encoder.encode([{ pixels, width: 86, height: 1 }], BatchNoise.forItems([{ seed: 1 }]));
    const plane = 86;
    const read = (i: number) => out[(i % 3) * plane + Math.floor(i / 3)];
    expect(Array.from(bytes, (_, i) => read(i))).toEqual(Array.from(bytes, diffusersSigned));
  });

  it("for an inpainting UNet is the picture with its masked pixels 0, as diffusers' init_image x (mask < 0.5)", async () => {
    const pixels = Uint8Array.from({ length: W * H * 3 }, (_, i) => 10 + 30 * i);
    const mask = Uint8Array.from([255, 0, 0, 255, 0, 255, 0, 0]);
    const item = { prompt: '', negativePrompt: '', seed: 1, image: { pixels, width: W, height: H }, mask };
    const noise = BatchNoise.forItems([item]);
    // A latent grid the size of the picture (scale 1), three channels: what the encoder gave lands unchanged in channels 1 to 3.
    const extra = await inpaintingChannels({ items: [item], width: W, height: H }, { channels: 3, height: H, width: W }, (images) => encoder.encode(images, noise));
    const plane = W * H;
    expect([...extra.subarray(0, plane)]).toEqual([...mask].map((m) => (m ? 1 : 0)));
    for (let c = 0; c < 3; c++) {
      const channel = [...extra.subarray((1 + c) * plane, (2 + c) * plane)];
      expect(channel).toEqual([...mask].map((m, p) => (m ? 0 : diffusersSigned(pixels[p * 3 + c]))));
    }
  });
});
