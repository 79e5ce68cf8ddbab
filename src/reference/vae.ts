/**
 * The reference VAE: the linear latent code of latent-code.ts with the family's scaling (and FLUX's
 * shift) on the outside, exactly where the real VAEs have it. Pipelines decode latents / scaling
 * (+ shift) and scale encoder output back, so a pipeline that forgets the scaling factor decodes a
 * washed-out (or over-saturated) picture.
 */
import { latentCode, VAE_SCALE } from './latent-code.js';
import { Graph } from './onnx-graph.js';

export interface VaeOptions {
  channels: number;
  scalingFactor: number;
  /** FLUX only. */
  shiftFactor?: number;
  float: 'float32' | 'float16';
  /**
   * `latent_sample` (legacy diffusers export: the latent itself) or `latent_parameters` (Optimum:
   * mean and log-variance stacked on channels).
   */
  encoderOutput: 'latent_sample' | 'latent_parameters';
}

/** Log-variance of the encoder's posterior: std e^-15, so a sampled latent is the mean. */
const LOG_VARIANCE = -30;

/** [C, 3] (encode) or [3, C] (decode, M^T) as 1x1 convolution weights. */
function codeWeights(g: Graph, name: string, channels: number, transpose: boolean): string {
  const m = latentCode(channels);
  const weights = new Float32Array(channels * 3);
  for (let c = 0; c < channels; c++) {
    for (let k = 0; k < 3; k++) weights[transpose ? k * channels + c : c * 3 + k] = m[c * 3 + k];
  }
  return g.initializer(name, 'float32', transpose ? [3, channels, 1, 1] : [channels, 3, 1, 1], weights);
}

export function vaeDecoder(opts: VaeOptions): Graph {
  const g = new Graph('reference_vae_decoder');
  const latent = g.input('latent_sample', opts.float, ['batch', opts.channels, 'latent_height', 'latent_width']);
  const shifted = opts.shiftFactor === undefined ? latent : g.op('Sub', [latent, g.floats(opts.shiftFactor)]);
  const modelSpace = g.op('Mul', [shifted, g.floats(opts.scalingFactor)]);
  const rgb = g.op('Conv', [modelSpace, codeWeights(g, 'post_quant_code', opts.channels, true)]);
  const image = g.op('Resize', [rgb, '', g.floats([1, 1, VAE_SCALE, VAE_SCALE])], { mode: 'linear' });
  g.output('sample', image, opts.float, ['batch', 3, 'height', 'width']);
  return g;
}

export function vaeEncoder(opts: VaeOptions): Graph {
  const g = new Graph('reference_vae_encoder');
  const image = g.input('sample', opts.float, ['batch', 3, 'height', 'width']);
  const blocks = g.op('AveragePool', [image], { kernel_shape: [VAE_SCALE, VAE_SCALE], strides: [VAE_SCALE, VAE_SCALE] });
  const modelSpace = g.op('Conv', [blocks, codeWeights(g, 'quant_code', opts.channels, false)]);
  const scaled = g.op('Div', [modelSpace, g.floats(opts.scalingFactor)]);
  const mean = opts.shiftFactor === undefined ? scaled : g.op('Add', [scaled, g.floats(opts.shiftFactor)]);
  const latentDims = ['batch', opts.channels, 'latent_height', 'latent_width'];
  if (opts.encoderOutput === 'latent_sample') {
    g.output('latent_sample', mean, opts.float, latentDims);
  } else {
    const logVariance = g.op('Expand', [g.floats(LOG_VARIANCE), g.op('Shape', [mean])]);
    g.output('latent_parameters', g.op('Concat', [mean, logVariance], { axis: 1 }), opts.float, ['batch', 2 * opts.channels, 'latent_height', 'latent_width']);
  }
  return g;
}
