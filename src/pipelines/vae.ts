import type { OnnxModel } from '../engine/onnx-model.js';
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
