import sharp from 'sharp';
import { WorkerRuntime } from '../src/pipelines/run.js';
import type { RgbImage } from '../src/runtime/types.js';
import { REAL_EXPORTS, haveRealExports, realExport } from '../test/helpers/real-exports.js';
import { DEMO_MODEL_DIR } from '../test/helpers/demo-model.js';

/**
 * 1024x1024 pictures to encode: the embedded model's (flat shapes: compresses far better than a photo),
 * a real-architecture export's (random weights: texture close to noise, compresses far worse), and a
 * photo stand-in between the two: 1/f noise, whose power spectrum falls with frequency as natural
 * photographs' do (no photographs ship with the project). Deterministic for a given size.
 */

export interface Picture {
  name: string;
  image: RgbImage;
}

const SIDE = 1024;

async function generated(dir: string, steps: number): Promise<RgbImage> {
  const runtime = new WorkerRuntime();
  const [image] = await runtime.generateImages({ modelDir: dir, width: SIDE, height: SIDE, steps, guidanceScale: 0, items: [{ prompt: 'a red circle on a blue background', negativePrompt: '', seed: 3 }] });
  return image;
}

/** Octaves of seeded random colour noise, each upsampled to the full size and weighted by its scale. */
async function photoLike(side = SIDE): Promise<RgbImage> {
  let state = 12345;
  const random = () => (state = (Math.imul(state, 1664525) + 1013904223) >>> 0) / 2 ** 32;
  const sum = new Float32Array(side * side * 3);
  for (let octave = 4; octave <= side; octave *= 2) {
    const coarse = Buffer.alloc(octave * octave * 3);
    for (let i = 0; i < coarse.length; i++) coarse[i] = Math.floor(random() * 256);
    const up = await sharp(coarse, { raw: { width: octave, height: octave, channels: 3 } }).resize(side, side, { kernel: 'cubic' }).raw().toBuffer();
    const weight = octave ** -0.9;
    for (let i = 0; i < sum.length; i++) sum[i] += (up[i] - 127.5) * weight;
  }
  const peak = sum.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
  const pixels = new Uint8Array(sum.length);
  for (let i = 0; i < sum.length; i++) pixels[i] = Math.max(0, Math.min(255, Math.round(127.5 + (191 * sum[i]) / peak)));
  return { pixels, width: side, height: side };
}

export async function pictures(): Promise<{ pictures: Picture[]; skipped?: string }> {
  const list: Picture[] = [{ name: 'photo-like (1/f noise)', image: await photoLike() }, { name: 'demo model (flat shapes)', image: await generated(DEMO_MODEL_DIR, 4) }];
  if (!haveRealExports) return { pictures: list, skipped: `the real-export picture: ${REAL_EXPORTS} is absent` };
  list.push({ name: 'flux export (random texture)', image: await generated(realExport('flux'), 1) });
  return { pictures: list };
}
