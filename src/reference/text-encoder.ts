/**
 * The reference CLIP text encoder: an embedding lookup that maps each concept word's token to its
 * concept's one-hot direction and every other token (bos, eos, padding, unknown words) to zero. The
 * pooled output says which concepts the prompt mentions.
 */
import type { ClipVocabulary } from './clip-vocabulary.js';
import { conceptEmbedding, conceptPresence } from './concept-graph.js';
import { CONCEPT_WORDS } from './concepts.js';
import { Graph, type Dim } from './onnx-graph.js';

export interface ClipEncoderOptions {
  vocab: ClipVocabulary;
  hidden: number;
  idsType: 'int32' | 'int64';
  float: 'float32' | 'float16';
  /**
   * SDXL's exports: also emit hidden_states.0..2. Only the penultimate (hidden_states.1, what SDXL
   * pipelines use) carries the concept vectors; the other layers and last_hidden_state carry them with
   * the hidden dimensions reversed, so a pipeline that reads the wrong layer gets the wrong concepts.
   */
  hiddenStates: boolean;
  /** CLIPTextModelWithProjection (SDXL's second encoder): `text_embeds` instead of `pooler_output`. */
  projection: boolean;
}

/** Layers of the pretend transformer: hidden_states.0..LAYERS. */
const LAYERS = 2;

export function clipTextEncoder(opts: ClipEncoderOptions): Graph {
  const g = new Graph('clip_text_encoder');
  const { hidden, float } = opts;
  const ids = g.input('input_ids', opts.idsType, ['batch', 'sequence']);
  const tokenConcepts = CONCEPT_WORDS.map(([word, concept]) => [opts.vocab.wordId(word), concept] as const);
  const concepts = conceptEmbedding(g, ids, tokenConcepts, opts.vocab.size, hidden);
  const pooled = conceptPresence(g, concepts);
  const states = ['batch', 'sequence', hidden];
  const scrambled = opts.hiddenStates
    ? g.op('Gather', [concepts, g.ints(Array.from({ length: hidden }, (_, i) => hidden - 1 - i))], { axis: 2 })
    : concepts;

  const outputs: Array<[name: string, value: string, dims: Dim[]]> = [
    ['last_hidden_state', scrambled, states],
    [opts.projection ? 'text_embeds' : 'pooler_output', pooled, ['batch', hidden]],
  ];
  // Optimum's export of the projection model lists text_embeds first.
  if (opts.projection) outputs.reverse();
  if (opts.hiddenStates) {
    for (let layer = 0; layer <= LAYERS; layer++) outputs.push([`hidden_states.${layer}`, layer === LAYERS - 1 ? concepts : scrambled, states]);
  }
  for (const [name, value, dims] of outputs) g.output(name, value, float, dims);
  return g;
}
