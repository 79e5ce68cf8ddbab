import path from 'node:path';
import { DEMO_MODEL_DIR } from './demo-model.js';
import { loadTokenizer } from '../../src/tokenizers/load.js';

/** The demo model's tokenizer folder: a real CLIP BPE, small. */
export const DEMO_TOKENIZER = path.join(DEMO_MODEL_DIR, 'tokenizer');

/**
 * A short prompt's tokens without its markers, read off the encoder row the model gets (77 long):
 * the tokens between the start marker and the first end marker. Independent of the server's counting.
 */
export async function demoPromptTokens(prompt: string): Promise<number> {
  const tokenizer = await loadTokenizer(DEMO_TOKENIZER);
  const [bos, eos] = tokenizer.encode('');
  const row = tokenizer.encode(prompt);
  if (row[0] !== bos || !row.includes(eos)) throw new Error(`'${prompt}' is too long to be counted from one encoder row`);
  return row.indexOf(eos) - 1;
}
