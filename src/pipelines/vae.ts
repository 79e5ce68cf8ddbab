import type { OnnxModel } from '../runtime/onnx-model.js';
import type { BatchNoise } from '../runtime/random.js';
import type { RgbImage } from './pipeline.js';

/**
 * The VAE decoder: undoes the latent scaling (z / scaling_factor + shift_factor), decodes one image at
 * a time to bound memory at large sizes, and maps [-1, 1] to 8-bit RGB.
 */
export class VaeDecoder {
  constructor(
    private readonly model: OnnxModel,
    private readonly scalingFactor: number,
    private readonly shiftFactor: number,
  ) {}

  release(): Promise<void> {
    return this.model.release();
  }

  async decode(latents: Float32Array, batch: number, channels: number, latentHeight: number, latentWidth: number): Promise<RgbImage[]> {
    const per = channels * latentHeight * latentWidth;
    const images: RgbImage[] = [];
    for (let b = 0; b < batch; b++) {
      const z = latents.slice(b * per, (b + 1) * per);
      for (let i = 0; i < z.length; i++) z[i] = z[i] / this.scalingFactor + this.shiftFactor;
      const { sample } = await this.model.run({ latent_sample: { data: z, dims: [1, channels, latentHeight, latentWidth] } }, ['sample']);
      images.push(toRgb(sample.data as Float32Array, sample.dims[2], sample.dims[3]));
    }
    return images;
  }
}

/** [1, 3, H, W] in [-1, 1] -> interleaved 8-bit RGB. */
function toRgb(chw: Float32Array, height: number, width: number): RgbImage {
  const plane = height * width;
  const pixels = new Uint8Array(plane * 3);
  for (let c = 0; c < 3; c++) {
    for (let i = 0; i < plane; i++) {
      const v = Math.min(1, Math.max(0, chw[c * plane + i] / 2 + 0.5));
      pixels[i * 3 + c] = Math.round(v * 255);
    }
  }
  return { pixels, width, height };
}

/**
 * The VAE encoder, for image-to-image: 8-bit RGB to [-1, 1], encoded one image at a time, and scaled
 * into the denoiser's latent space ((z - shift_factor) x scaling_factor). Optimum's encoders output the
 * posterior's mean and log-variance (`latent_parameters`); as diffusers' img2img pipelines do, a latent
 * is sampled from it with the item's own generator. Legacy exports output the latent itself.
 */
export class VaeEncoder {
  private readonly output: string;

  constructor(
    private readonly model: OnnxModel,
    private readonly scalingFactor: number,
    private readonly shiftFactor: number,
  ) {
    this.output = model.outputNames.includes('latent_parameters') ? 'latent_parameters' : 'latent_sample';
  }

  release(): Promise<void> {
    return this.model.release();
  }

  /** [batch, C, h, w] latents of the images, in item order. */
  async encode(images: readonly RgbImage[], noise: BatchNoise): Promise<Float32Array> {
    const parts: Float32Array[] = [];
    for (const image of images) {
      const sample = { data: toSigned(image), dims: [1, 3, image.height, image.width] };
      const { [this.output]: out } = await this.model.run({ sample }, [this.output]);
      parts.push(out.data as Float32Array);
    }
    const per = parts[0].length / (this.output === 'latent_parameters' ? 2 : 1);
    // One draw per item, each from its own generator: diffusers samples every item's posterior first.
    const eps = this.output === 'latent_parameters' ? noise.randn(per) : undefined;
    const latents = new Float32Array(per * images.length);
    parts.forEach((part, b) => {
      for (let i = 0; i < per; i++) {
        let z = part[i];
        if (eps) z += Math.exp(0.5 * Math.min(20, Math.max(-30, part[per + i]))) * eps[b * per + i];
        latents[b * per + i] = (z - this.shiftFactor) * this.scalingFactor;
      }
    });
    return latents;
  }
}

/** Interleaved 8-bit RGB -> [1, 3, H, W] in [-1, 1]. */
function toSigned({ pixels, width, height }: RgbImage): Float32Array {
  const plane = width * height;
  const out = new Float32Array(plane * 3);
  for (let i = 0; i < plane; i++) {
    for (let c = 0; c < 3; c++) out[c * plane + i] = pixels[i * 3 + c] / 127.5 - 1;
  }
  return out;
}
