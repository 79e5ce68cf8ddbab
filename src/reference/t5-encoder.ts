/**
 * The reference T5 encoder (FLUX's text_encoder_2): the same concept lookup as the CLIP encoder, over
 * the T5 vocabulary's whole-word pieces.
 */
import { conceptEmbedding } from './concept-graph.js';
import { CONCEPT_WORDS } from './concepts.js';
import { Graph } from './onnx-graph.js';
import type { T5Vocabulary } from './t5-vocabulary.js';

export interface T5EncoderOptions {
  vocab: T5Vocabulary;
  hidden: number;
  float: 'float32' | 'float16';
}

export function t5Encoder(opts: T5EncoderOptions): Graph {
  const g = new Graph('t5_encoder');
  const ids = g.input('input_ids', 'int64', ['batch', 'sequence']);
  const tokenConcepts = CONCEPT_WORDS.flatMap(([word, concept]) => opts.vocab.wordIds(word).map((id) => [id, concept] as const));
  const concepts = conceptEmbedding(g, ids, tokenConcepts, opts.vocab.size, opts.hidden);
  g.output('last_hidden_state', concepts, opts.float, ['batch', 'sequence', opts.hidden]);
  return g;
}
