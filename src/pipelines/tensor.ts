import type { FloatTensor } from '../runtime/onnx-model.js';

/** Small helpers over flat [batch, ...] float tensors. */

/** Concatenates along the batch axis. */
export function concatBatch(parts: readonly Float32Array[]): Float32Array {
  const out = new Float32Array(parts.reduce((n, p) => n + p.length, 0));
  let offset = 0;
  for (const p of parts) {
    out.set(p, offset);
    offset += p.length;
  }
  return out;
}

/** Two [batch, ...] tensors as one, `a`'s rows first. */
export function concatRows(a: FloatTensor, b: FloatTensor): FloatTensor {
  return { data: concatBatch([a.data, b.data]), dims: [a.dims[0] + b.dims[0], ...a.dims.slice(1)] };
}

/** Per row, `a`'s part then `b`'s: [rows, ...a] ++ [rows, ...b] along everything after the row axis. */
export function concatPerRow(a: Float32Array | Int32Array, b: Float32Array | Int32Array, rows: number): Float32Array {
  const [perA, perB] = [a.length / rows, b.length / rows];
  const out = new Float32Array(a.length + b.length);
  for (let r = 0; r < rows; r++) {
    out.set(a.subarray(r * perA, (r + 1) * perA), r * (perA + perB));
    out.set(b.subarray(r * perB, (r + 1) * perB), r * (perA + perB) + perA);
  }
  return out;
}

export function filled(length: number, value: number): Float32Array {
  return new Float32Array(length).fill(value);
}

/**
 * Classifier-free guidance over a [uncond; cond] model output: u + g (c - u), then diffusers'
 * guidance_rescale, which pulls each image's std back towards the conditional prediction's.
 */
export function applyGuidance(output: Float32Array, batch: number, scale: number, rescale = 0): Float32Array {
  const half = output.length / 2;
  const uncond = output.subarray(0, half);
  const cond = output.subarray(half);
  const guided = new Float32Array(half);
  for (let i = 0; i < half; i++) guided[i] = uncond[i] + scale * (cond[i] - uncond[i]);
  if (rescale > 0) {
    const per = half / batch;
    for (let b = 0; b < batch; b++) {
      const g = guided.subarray(b * per, (b + 1) * per);
      const ratio = std(cond.subarray(b * per, (b + 1) * per)) / std(g);
      for (let i = 0; i < per; i++) g[i] = rescale * g[i] * ratio + (1 - rescale) * g[i];
    }
  }
  return guided;
}

function std(x: Float32Array): number {
  let mean = 0;
  for (const v of x) mean += v;
  mean /= x.length;
  let variance = 0;
  for (const v of x) variance += (v - mean) ** 2;
  // torch.std is the unbiased estimate; the ratio of two of them is the same either way.
  return Math.sqrt(variance / Math.max(1, x.length - 1)) || 1;
}
