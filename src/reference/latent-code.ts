/**
 * The reference latent space: each latent pixel is a fixed linear code of the mean RGB (in [-1, 1]) of
 * an 8x8 image block, z = M rgb, where M is C x 3 with orthonormal columns. Decoding is therefore
 * exact for block-constant images (rgb = M^T z), and grey (rgb 0) is the zero latent.
 *
 * This is the "model space" the denoiser works in. The VAE files hold the same maps with the family's
 * scaling (and FLUX shift) folded in, see vae.ts.
 */

export const VAE_SCALE = 8;

/**
 * M as row-major [C][3]: columns 1..3 of the Sylvester Hadamard matrix of order C, divided by
 * sqrt(C). Column 0 (all ones) is skipped so that every channel mixes R, G and B with signs, like a
 * real VAE's latent channels do.
 */
export function latentCode(channels: number): Float32Array {
  if (channels < 4 || (channels & (channels - 1)) !== 0) throw new Error(`latent channels must be a power of two >= 4, got ${channels}`);
  const m = new Float32Array(channels * 3);
  const norm = 1 / Math.sqrt(channels);
  for (let c = 0; c < channels; c++) {
    for (let k = 0; k < 3; k++) {
      let bits = c & (k + 1);
      let sign = 1;
      for (; bits; bits &= bits - 1) sign = -sign;
      m[c * 3 + k] = sign * norm;
    }
  }
  return m;
}

/**
 * Encodes an RGB image (CHW, values 0..1, sides multiples of 8) to its model-space latent [C, H/8, W/8].
 * The same maths as the ONNX VAE encoder, before its scaling.
 */
export function encodeImage(rgb: Float32Array, height: number, width: number, channels: number): Float32Array {
  const m = latentCode(channels);
  const h = height / VAE_SCALE;
  const w = width / VAE_SCALE;
  const latent = new Float32Array(channels * h * w);
  const mean = [0, 0, 0];
  for (let i = 0; i < h; i++) {
    for (let j = 0; j < w; j++) {
      for (let k = 0; k < 3; k++) {
        let sum = 0;
        for (let y = i * VAE_SCALE; y < (i + 1) * VAE_SCALE; y++) {
          for (let x = j * VAE_SCALE; x < (j + 1) * VAE_SCALE; x++) sum += rgb[(k * height + y) * width + x];
        }
        mean[k] = (2 * sum) / (VAE_SCALE * VAE_SCALE) - 1;
      }
      for (let c = 0; c < channels; c++) {
        latent[(c * h + i) * w + j] = m[c * 3] * mean[0] + m[c * 3 + 1] * mean[1] + m[c * 3 + 2] * mean[2];
      }
    }
  }
  return latent;
}
