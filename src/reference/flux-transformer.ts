/**
 * The reference FLUX transformer: the exact velocity of the rectified flow x_s = (1 - s) z + s eps
 * whose data are the prototype latents, on the pipeline's packed 2x2 latent sequence. Colours are read
 * from the T5 states and shapes from the CLIP pooled projection, so both encoders must be wired right.
 */
import { conceptLogPrior, conceptPresence, PRIOR_STRENGTH, sliceDims } from './concept-graph.js';
import { COLOUR_DIMS, SHAPE_DIMS } from './concepts.js';
import { Graph } from './onnx-graph.js';
import { posteriorMean, resizedMasks } from './posterior.js';
import { MASK_COUNT, type PrototypeBank } from './prototypes.js';

export interface FluxOptions {
  bank: PrototypeBank;
  float: 'float32' | 'float16';
  /** Width of the T5 states (encoder_hidden_states). */
  textHidden: number;
  /** Width of the CLIP pooled output (pooled_projections). */
  pooled: number;
  /** FLUX-dev's distilled guidance input: the prior's strength scales with guidance / 3.5. */
  guidance: boolean;
}

/** FLUX-dev's default guidance scale, at which the prior has its standard strength. */
const DEFAULT_GUIDANCE = 3.5;
/** sigma = 0 is never sampled, but keeps the graph finite if it were. */
const MIN_SIGMA = 1e-4;
/** Channels of a packed token: 16 latent channels x a 2x2 patch. */
const PACKED_CHANNELS = 64;

export function fluxTransformer(opts: FluxOptions): Graph {
  const g = new Graph('reference_flux_transformer');
  const { float, bank } = opts;
  const hiddenStates = g.input('hidden_states', float, ['batch', 'image_sequence', PACKED_CHANNELS]);
  const textStates = g.input('encoder_hidden_states', float, ['batch', 'text_sequence', opts.textHidden]);
  const pooled = g.input('pooled_projections', float, ['batch', opts.pooled]);
  const timestep = g.input('timestep', float, ['batch']);
  const imageIds = g.input('img_ids', float, ['image_sequence', 3]);
  // Text positions only matter to attention's rotary embedding, which the reference model has none of.
  g.input('txt_ids', float, ['text_sequence', 3]);
  const guidance = opts.guidance ? g.input('guidance', float, ['batch']) : undefined;

  // The latent grid: row i * W2 + j of img_ids is (0, i, j), so [H2, W2] = max over rows + 1.
  const gridFloat = g.op('Add', [g.op('ReduceMax', [sliceDims(g, imageIds, { from: 1, to: 3 }, 1)], { axes: [0], keepdims: 0 }), g.floats(1)]);
  const grid = g.cast(gridFloat, 'int64');
  // The pipeline packs latent[c, 2i + dy, 2j + dx] into token i * W2 + j, feature c * 4 + dy * 2 + dx.
  // Positions are therefore (token, dy * 2 + dx): the masks are packed into that order, and x's
  // features are split into channel and sub-position, so a mis-packed latent matches no prototype.
  const masks = resizedMasks(g, bank, g.op('Mul', [grid, g.ints([2])]));
  const patches = g.op('Concat', [g.ints([MASK_COUNT]), sliceDims(g, grid, { from: 0, to: 1 }, 0), g.ints([2]), sliceDims(g, grid, { from: 1, to: 2 }, 0), g.ints([2])], { axis: 0 });
  const packedMasks = g.op('Flatten', [g.op('Transpose', [g.op('Reshape', [masks, patches])], { perm: [0, 1, 3, 2, 4] })], { axis: 1 });
  // [batch, tokens, C * 4] -> [batch, tokens, C, 4] -> [batch, C, tokens, 4] -> [batch, C, tokens * 4].
  const byChannel = g.op('Transpose', [g.op('Reshape', [hiddenStates, g.ints([0, 0, bank.channels, 4])])], { perm: [0, 2, 1, 3] });
  const x = g.op('Reshape', [byChannel, g.ints([0, 0, -1])]);

  const concepts = g.op('Concat', [conceptPresence(g, sliceDims(g, textStates, COLOUR_DIMS, 2)), sliceDims(g, pooled, SHAPE_DIMS, 1)], { axis: 1 });
  const strength = guidance
    ? g.op('Mul', [g.op('Reshape', [guidance, g.ints([-1, 1])]), g.floats(PRIOR_STRENGTH / DEFAULT_GUIDANCE)])
    : g.floats(PRIOR_STRENGTH);
  const logPrior = conceptLogPrior(g, concepts, strength);

  const sigma = g.op('Max', [g.op('Reshape', [timestep, g.ints([-1, 1, 1])]), g.floats(MIN_SIGMA)]);
  const signal = g.op('Sub', [g.floats(1), sigma]);
  const zHat = posteriorMean(g, bank, { x, masks: packedMasks, logPrior, signal, noiseVar: g.op('Mul', [sigma, sigma]) });
  // Back to tokens: [batch, C, tokens * 4] -> [batch, tokens, C, 4] -> [batch, tokens, C * 4].
  const packedZHat = g.op('Reshape', [g.op('Transpose', [g.op('Reshape', [zHat, g.ints([0, 0, -1, 4])])], { perm: [0, 2, 1, 3] }), g.op('Shape', [hiddenStates])]);
  const velocity = g.op('Div', [g.op('Sub', [hiddenStates, packedZHat]), sigma]);
  g.output('out_hidden_states', velocity, float, ['batch', 'image_sequence', PACKED_CHANNELS]);
  return g;
}
