/**
 * The exact denoiser of a finite data set, shared by the UNet (variance preserving) and the FLUX
 * transformer (rectified flow). Both forward processes are x = signal * z + noise with noise of
 * variance `noiseVar`, so the posterior over the prototypes z_k is
 *   w_k = softmax_k( log pi_k - ||x - signal z_k||^2 / (2 noiseVar) )
 * and the ||x||^2 term, the same for every k, drops out of the softmax:
 *   logits_k = log pi_k + (signal <x, z_k> - signal^2 ||z_k||^2 / 2) / noiseVar.
 * VP: signal = sqrt(abar), noiseVar = 1 - abar. Flow: signal = 1 - s, noiseVar = s^2.
 */
import type { Graph } from './onnx-graph.js';
import { BANK_SIZE, type PrototypeBank } from './prototypes.js';

/**
 * The prototype latents [K, C, 32, 32], resized (bilinear) to [K, C, height, width] where `size` is an
 * int64 [2] tensor [height, width], so any image size works.
 */
export function resizedBank(g: Graph, bank: PrototypeBank, size: string): string {
  const latents = g.initializer('prototype_latents', 'float32', [bank.count, bank.channels, BANK_SIZE, BANK_SIZE], bank.latents);
  const sizes = g.op('Concat', [g.ints([bank.count, bank.channels]), size], { axis: 0 });
  return g.op('Resize', [latents, '', '', sizes], { mode: 'linear' });
}

/**
 * z_hat = sum_k w_k z_k for flattened samples x [batch, D] and prototypes Z [K, D]. `logPrior` is
 * [batch, K]; `signal` and `noiseVar` are [n, 1] with n = 1 or batch. Returns [batch, D].
 */
export function posteriorMean(g: Graph, x: string, prototypes: string, logPrior: string, signal: string, noiseVar: string): string {
  const dots = g.op('Gemm', [x, prototypes], { transB: 1 });
  const halfSquaredNorms = g.op('Mul', [g.op('ReduceSum', [g.op('Mul', [prototypes, prototypes]), g.ints([1])], { keepdims: 0 }), g.floats(0.5)]);
  const fit = g.op('Sub', [g.op('Mul', [signal, dots]), g.op('Mul', [g.op('Mul', [signal, signal]), halfSquaredNorms])]);
  const logits = g.op('Add', [logPrior, g.op('Div', [fit, noiseVar])]);
  const weights = g.op('Softmax', [logits], { axis: -1 });
  return g.op('MatMul', [weights, prototypes]);
}

/** Flattens every axis after the first: [n, ...] -> [n, D]. */
export function flatten(g: Graph, x: string): string {
  return g.op('Flatten', [x], { axis: 1 });
}
