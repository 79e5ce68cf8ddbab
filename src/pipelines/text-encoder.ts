import type { HostTensor, OnnxModel } from '../engine/onnx-model.js';
import type { TextTokenizer } from '../tokenizers/tokenizer.js';

/** A tokenizer and its text encoder, run together on a list of prompts. */
export class TextEncoder {
  constructor(
    readonly model: OnnxModel,
    readonly tokenizer: TextTokenizer,
  ) {}

  async encode(prompts: readonly string[], outputs: readonly string[]): Promise<Record<string, HostTensor>> {
    const length = this.tokenizer.maxLength;
    const ids = new Int32Array(prompts.length * length);
    prompts.forEach((prompt, b) => ids.set(this.tokenizer.encode(prompt), b * length));
    return this.model.run({ input_ids: { data: ids, dims: [prompts.length, length] } }, outputs);
  }

  /**
   * SDXL conditions on the penultimate layer (`hidden_states[-2]`); exports list the layers as
   * `hidden_states.0..N`. Without them the last hidden state is the best there is.
   */
  penultimateHiddenState(): string {
    const layers = this.model.outputNames
      .map((name) => /^hidden_states\.(\d+)$/.exec(name))
      .filter((m): m is RegExpExecArray => m !== null)
      .map((m) => Number(m[1]));
    if (layers.length < 2) return 'last_hidden_state';
    return `hidden_states.${Math.max(...layers) - 1}`;
  }
}
