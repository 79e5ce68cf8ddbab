/**
 * The exact denoiser of a finite data set, shared by the UNet (variance preserving) and the FLUX
 * transformer (rectified flow). Both forward processes are x = signal * z + noise with noise of
 * variance `noiseVar`, so the posterior over the prototypes z_k is
 *   w_k = softmax_k( log pi_k - ||x - signal z_k||^2 / (2 noiseVar) )
 * and the ||x||^2 term, the same for every k, drops out of the softmax:
 *   logits_k = log pi_k + (signal <x, z_k> - signal^2 ||z_k||^2 / 2) / noiseVar.
 * VP: signal = sqrt(abar), noiseVar = 1 - abar. Flow: signal = 1 - s, noiseVar = s^2.
 *
 * The prototypes are never materialised: z_k[channel, pixel] = code_c[channel] * mask_m[pixel] with
 * k = c * masks + m (see prototypes.ts), so every product with Z goes through the two small factors.
 */
import { COLOUR_NAMES, SHAPES } from './concepts.js';
import type { Graph } from './onnx-graph.js';
import { BANK_SIZE, MASK_COUNT, PLACEMENTS, type PrototypeBank } from './prototypes.js';

const COLOURS = COLOUR_NAMES.length;

/**
 * The masks [M, 1, 32, 32] resized (bilinear) to [M, 1, height, width], where `size` is an int64 [2]
 * tensor [height, width], so any image size works. Resizing the masks is resizing the prototypes:
 * each is a mask times a constant colour code.
 */
export function resizedMasks(g: Graph, bank: PrototypeBank, size: string): string {
  const masks = g.initializer('shape_masks', 'float32', [MASK_COUNT, 1, BANK_SIZE, BANK_SIZE], bank.masks);
  const sizes = g.op('Concat', [g.ints([MASK_COUNT, 1]), size], { axis: 0 });
  return g.op('Resize', [masks, '', '', sizes], { mode: 'linear' });
}

export interface PosteriorInputs {
  /** Samples as [batch, C, P]: latent channels by positions. */
  x: string;
  /** [M, P]: each mask over the same positions as x. */
  masks: string;
  /** [batch, colours, shapes, 1]: log pi_k is the same for every placement (see concept-graph.ts). */
  logPrior: string;
  /** [n, 1, 1] with n = 1 or batch. */
  signal: string;
  noiseVar: string;
}

/** z_hat = sum_k w_k z_k as [batch, C, P]. */
export function posteriorMean(g: Graph, bank: PrototypeBank, { x, masks, logPrior, signal, noiseVar }: PosteriorInputs): string {
  const codes = g.initializer('colour_codes', 'float32', [COLOURS, bank.channels], bank.colourCodes);
  // <x, z_k> = sum_pixel mask_m(pixel) <x(pixel), code_c>: [batch, colours, P], then [batch, colours, M].
  const perColour = g.op('MatMul', [codes, x]);
  const dots = g.op('MatMul', [perColour, g.op('Transpose', [masks], { perm: [1, 0] })]);
  // ||z_k||^2 / 2 = ||code_c||^2 ||mask_m||^2 / 2: [colours, 1] x [M].
  const squaredNorms = (t: string, axis: number, keepdims: number) => g.op('ReduceSum', [g.op('Mul', [t, t]), g.ints([axis])], { keepdims });
  const halfSquaredNorms = g.op('Mul', [g.op('Mul', [squaredNorms(codes, 1, 1), squaredNorms(masks, 1, 0)]), g.floats(0.5)]);
  const fit = g.op('Sub', [g.op('Mul', [signal, dots]), g.op('Mul', [g.op('Mul', [signal, signal]), halfSquaredNorms])]);
  // Split M into shapes x placements to add the prior, then one softmax over all K prototypes.
  const perPlacement = g.op('Reshape', [g.op('Div', [fit, noiseVar]), g.ints([0, COLOURS, SHAPES.length, PLACEMENTS.length])]);
  const logits = g.op('Reshape', [g.op('Add', [perPlacement, logPrior]), g.ints([0, -1])]);
  const weights = g.op('Reshape', [g.op('Softmax', [logits], { axis: -1 }), g.ints([0, COLOURS, MASK_COUNT])]);
  // sum_k w_k z_k = codes^T (W masks): [batch, colours, P], then [batch, C, P].
  const perColourMean = g.op('MatMul', [weights, masks]);
  return g.op('MatMul', [g.op('Transpose', [codes], { perm: [1, 0] }), perColourMean]);
}
