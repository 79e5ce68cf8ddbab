/**
 * The reference UNet: the exact epsilon (or v) prediction of the variance-preserving diffusion whose
 * data are the prototype latents, conditioned through the concept prior (see posterior.ts).
 */
import { conceptLogPrior, conceptPresence, PRIOR_STRENGTH, sliceDims, type DimRange } from './concept-graph.js';
import { COLOUR_DIMS, CONCEPTS, SHAPE_DIMS } from './concepts.js';
import { INPAINTING_EXTRA_CHANNELS } from '../pipelines/inpainting-input.js';
import { Graph, type DType } from './onnx-graph.js';
import { posteriorMean, resizedMasks } from './posterior.js';
import type { PrototypeBank } from './prototypes.js';

/** How the prompt reaches the UNet. */
export type UnetConditioning =
  /** SD 1.x/2.x: one encoder's hidden states. */
  | { kind: 'clip'; hidden: number }
  /**
   * SDXL: encoder_hidden_states is the concat of both encoders' penultimate states (widths hidden[0]
   * and hidden[1]) and text_embeds is the second encoder's pooled output. Colours must be mentioned in
   * both halves of the concat (so both encoders, the right layer and the right order are needed) and
   * shapes are read from text_embeds only.
   */
  | { kind: 'sdxl'; hidden: [number, number]; pooled: number };

export interface UnetOptions {
  bank: PrototypeBank;
  float: 'float32' | 'float16';
  /** float scalar (Optimum), float [batch] (legacy) or int64 [batch] as exports differ. */
  timestep: { dtype: DType; rank: 0 | 1 };
  prediction: 'epsilon' | 'v_prediction';
  conditioning: UnetConditioning;
  /** LCM's guidance embedding input width; the reference model takes the input and ignores it. */
  timestepCondDim?: number;
  /**
   * An inpainting UNet (in_channels 4 + 5): the sample carries the mask (1 = repaint) and the masked
   * picture's latents after the noisy latents, and the clean estimate is the prompt's picture where the
   * mask is 1 and the given latents elsewhere, the ideal inpainter a real one is trained towards.
   */
  inpainting?: boolean;
}

const TRAIN_TIMESTEPS = 1000;

/**
 * sigma_t = sqrt((1 - abar_t) / abar_t) of SD's training schedule: scaled_linear betas from 0.00085 to
 * 0.012 over 1000 steps.
 */
export function sdSigmas(): Float32Array {
  const sigmas = new Float32Array(TRAIN_TIMESTEPS);
  const [from, to] = [Math.sqrt(0.00085), Math.sqrt(0.012)];
  let alphaBar = 1;
  for (let t = 0; t < TRAIN_TIMESTEPS; t++) {
    const beta = (from + ((to - from) * t) / (TRAIN_TIMESTEPS - 1)) ** 2;
    alphaBar *= 1 - beta;
    sigmas[t] = Math.sqrt((1 - alphaBar) / alphaBar);
  }
  return sigmas;
}

/** sigma at possibly fractional timesteps (any shape), by linear interpolation as diffusers' Euler schedulers do. */
function sigmaAt(g: Graph, t: string): string {
  const table = g.initializer('train_sigmas', 'float32', [TRAIN_TIMESTEPS], sdSigmas());
  const last = g.floats(TRAIN_TIMESTEPS - 1);
  const clamped = g.op('Clip', [t, g.floats(0), last]);
  const lower = g.op('Floor', [clamped]);
  const upper = g.op('Min', [g.op('Add', [lower, g.floats(1)]), last]);
  const frac = g.op('Sub', [clamped, lower]);
  const at = (index: string) => g.op('Gather', [table, g.cast(index, 'int64')], { axis: 0 });
  const [sLower, sUpper] = [at(lower), at(upper)];
  return g.op('Add', [sLower, g.op('Mul', [frac, g.op('Sub', [sUpper, sLower])])]);
}

/**
 * Declares the prompt inputs (encoder_hidden_states, and SDXL's text_embeds and time_ids) and returns
 * the concepts [batch, concepts] the prompt mentions.
 */
function promptInputs(g: Graph, conditioning: UnetConditioning, float: DType): string {
  if (conditioning.kind === 'clip') {
    const states = g.input('encoder_hidden_states', float, ['batch', 'sequence', conditioning.hidden]);
    return conceptPresence(g, sliceDims(g, states, { from: 0, to: CONCEPTS.length }, 2));
  }
  const [first, second] = conditioning.hidden;
  const states = g.input('encoder_hidden_states', float, ['batch', 'sequence', first + second]);
  const pooled = g.input('text_embeds', float, ['batch', conditioning.pooled]);
  // Micro-conditioning (original size, crop, target size): the prototypes have no size to match.
  g.input('time_ids', float, ['batch', 6]);
  const inSecondHalf: DimRange = { from: COLOUR_DIMS.from + first, to: COLOUR_DIMS.to + first };
  const colours = g.op('Mul', [
    conceptPresence(g, sliceDims(g, states, COLOUR_DIMS, 2)),
    conceptPresence(g, sliceDims(g, states, inSecondHalf, 2)),
  ]);
  const shapes = sliceDims(g, pooled, SHAPE_DIMS, 1);
  return g.op('Concat', [colours, shapes], { axis: 1 });
}

/** The sample's channels: the latents', and for an inpainting UNet the mask's and the masked picture's after them. */
export function unetInputChannels(channels: number, inpainting = false): number {
  return inpainting ? channels + INPAINTING_EXTRA_CHANNELS : channels;
}

export function unet(opts: UnetOptions): Graph {
  const g = new Graph('reference_unet');
  const { float } = opts;
  const channels = opts.bank.channels;
  const input = g.input('sample', float, ['batch', unetInputChannels(channels, opts.inpainting), 'height', 'width']);
  const slice = (from: number, to: number) => g.op('Slice', [input, g.ints([from]), g.ints([to]), g.ints([1])]);
  const sample = opts.inpainting ? slice(0, channels) : input;
  const timestep = g.input('timestep', opts.timestep.dtype, opts.timestep.rank === 0 ? [] : ['batch']);
  const concepts = promptInputs(g, opts.conditioning, float);
  if (opts.timestepCondDim) g.input('timestep_cond', float, ['batch', opts.timestepCondDim]);

  // Noise level as [n, 1, 1], n = 1 for a scalar timestep or the batch, to broadcast over [batch, C, pixels].
  const floatTimestep = opts.timestep.dtype === 'int64' ? g.cast(timestep, 'float32') : timestep;
  const sigma = sigmaAt(g, g.op('Reshape', [floatTimestep, g.ints([-1, 1, 1])]));
  // abar = 1 / (1 + sigma^2); 1 - abar is computed as sigma^2 abar, which keeps its precision near t = 0.
  const alphaBar = g.op('Reciprocal', [g.op('Add', [g.floats(1), g.op('Mul', [sigma, sigma])])]);
  const signal = g.op('Sqrt', [alphaBar]);
  const noiseStd = g.op('Mul', [sigma, signal]);
  const noiseVar = g.op('Mul', [noiseStd, noiseStd]);

  const sampleShape = g.op('Shape', [sample]);
  const spatial = g.op('Slice', [sampleShape, g.ints([2]), g.ints([4]), g.ints([0])]);
  const masks = g.op('Flatten', [resizedMasks(g, opts.bank, spatial)], { axis: 1 });
  const x = g.op('Reshape', [sample, g.ints([0, 0, -1])]);
  const logPrior = conceptLogPrior(g, concepts, g.floats(PRIOR_STRENGTH));
  const prompted = posteriorMean(g, opts.bank, { x, masks, logPrior, signal, noiseVar });
  const zHat = opts.inpainting ? kept(g, prompted, slice(channels, channels + 1), slice(channels + 1, unetInputChannels(channels, true))) : prompted;

  const eps = g.op('Div', [g.op('Sub', [x, g.op('Mul', [signal, zHat])]), noiseStd]);
  const prediction = opts.prediction === 'epsilon' ? eps : g.op('Sub', [g.op('Mul', [signal, eps]), g.op('Mul', [noiseStd, zHat])]);
  g.output('out_sample', g.op('Reshape', [prediction, sampleShape]), float, ['batch', channels, 'height', 'width']);
  return g;
}

/** mask * prompted + (1 - mask) * given, as [batch, C, P]: the inpainting UNet's clean estimate. */
function kept(g: Graph, prompted: string, mask: string, given: string): string {
  const flat = (t: string) => g.op('Reshape', [t, g.ints([0, 0, -1])]);
  const [m, z] = [flat(mask), flat(given)];
  return g.op('Add', [g.op('Mul', [m, prompted]), g.op('Mul', [g.op('Sub', [g.floats(1), m]), z])]);
}
