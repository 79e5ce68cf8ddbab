/**
 * Graph pieces shared by the text encoders and the denoisers: concept vectors in, which concepts a
 * prompt mentions out, and the prior that this puts on the prototypes.
 */
import { COLOUR_DIMS, COLOUR_NAMES, CONCEPTS, SHAPE_DIMS, SHAPES } from './concepts.js';
import type { Graph } from './onnx-graph.js';

/** Hidden dims [from, to) of a concept vector. */
export interface DimRange {
  from: number;
  to: number;
}

/**
 * Gathers rows of a [vocabSize, hidden] table in which token `id` of each (id, concept) pair is the
 * one-hot vector of `concept` and every other token is zero. Returns [batch, sequence, hidden].
 */
export function conceptEmbedding(g: Graph, ids: string, tokenConcepts: ReadonlyArray<readonly [id: number, concept: number]>, vocabSize: number, hidden: number): string {
  if (hidden < CONCEPTS.length) throw new Error(`hidden size ${hidden} is smaller than the ${CONCEPTS.length} concepts`);
  const table = new Float32Array(vocabSize * hidden);
  for (const [id, concept] of tokenConcepts) table[id * hidden + concept] = 1;
  return g.op('Gather', [g.initializer('token_embedding', 'float32', [vocabSize, hidden], table), ids], { axis: 0 });
}

/** Clip(sum over tokens, 0, 1): [batch, sequence, dims] -> [batch, dims], 1 where the prompt mentions the concept. */
export function conceptPresence(g: Graph, states: string): string {
  return g.op('Clip', [g.op('ReduceSum', [states, g.ints([1])], { keepdims: 0 }), g.floats(0), g.floats(1)]);
}

/** The entries [from, to) of a tensor along `axis`. */
export function sliceDims(g: Graph, x: string, dims: DimRange, axis: number): string {
  return g.op('Slice', [x, g.ints([dims.from]), g.ints([dims.to]), g.ints([axis])]);
}

/**
 * The prior's strength lambda: a mentioned concept favours the prototypes that have it by e^40. With
 * lambda = 12, 4-step FLUX-schnell sampling ended on a prototype of the wrong shape or colour in about
 * one seed in five: few-step samplers leave the data manifold, and there the likelihood, not the
 * prior, decides.
 */
export const PRIOR_STRENGTH = 40;

/**
 * log pi_k(c) = strength * (c_colour(k) + c_shape(k)) for concepts c [batch, concepts] in 0..1;
 * `strength` is a scalar or a [batch, 1] tensor. Returns [batch, colours, shapes, 1], to broadcast over
 * the placements, which the prompt cannot name. With no concept mentioned it is 0 for every prototype:
 * the uniform prior of the unconditional branch of classifier-free guidance.
 */
export function conceptLogPrior(g: Graph, concepts: string, strength: string): string {
  const weighted = g.op('Mul', [concepts, strength]);
  const colours = g.op('Reshape', [sliceDims(g, weighted, COLOUR_DIMS, 1), g.ints([0, COLOUR_NAMES.length, 1, 1])]);
  const shapes = g.op('Reshape', [sliceDims(g, weighted, SHAPE_DIMS, 1), g.ints([0, 1, SHAPES.length, 1])]);
  return g.op('Add', [colours, shapes]);
}
