import { describe, expect, it, vi } from 'vitest';
import { OnnxModel } from '../src/runtime/onnx-model.js';
import { inspectModel } from '../src/models/layout.js';
import { TextEncoder } from '../src/pipelines/text-encoder.js';
import { loadTokenizer } from '../src/tokenizers/load.js';
import { referenceModel } from './helpers/reference.js';

describe('text encoder', () => {
  it('encodes each distinct prompt once and gives every prompt its own row', async () => {
    const layout = await inspectModel(referenceModel('sd15-optimum'));
    const model = await OnnxModel.load(layout.textEncoder, { provider: 'cpu', threads: 1 });
    try {
      const encoder = new TextEncoder(model, await loadTokenizer(layout.tokenizer));
      const rowsRun: number[] = [];
      const run = model.run.bind(model);
      vi.spyOn(model, 'run').mockImplementation((feeds, outputs, prepared) => {
        rowsRun.push(feeds.input_ids.dims[0]);
        return run(feeds, outputs, prepared);
      });
      const separate = await encoder.encode(['a red circle', 'a blue square'], ['last_hidden_state']);
      const merged = await encoder.encode(['a red circle', 'a red circle', 'a blue square', 'a red circle'], ['last_hidden_state']);
      expect(rowsRun).toEqual([2, 2]);
      const { data, dims } = merged.last_hidden_state;
      expect(dims[0]).toBe(4);
      const per = data.length / 4;
      const row = (t: typeof data, i: number) => [...t.subarray(i * per, (i + 1) * per)];
      const [red, blue] = [row(separate.last_hidden_state.data, 0), row(separate.last_hidden_state.data, 1)];
      expect([row(data, 0), row(data, 1), row(data, 2), row(data, 3)]).toEqual([red, red, blue, red]);

      // The empty prompt is encoded the first time only, and its kept rows are the encoder's.
      const first = await encoder.encode(['', 'a red circle'], ['last_hidden_state', 'pooler_output']);
      const again = await encoder.encode(['a blue square', '', ''], ['last_hidden_state', 'pooler_output']);
      const onlyEmpty = await encoder.encode([''], ['last_hidden_state']);
      expect(rowsRun).toEqual([2, 2, 2, 1]);
      expect(row(again.last_hidden_state.data, 1)).toEqual(row(first.last_hidden_state.data, 0));
      expect(row(again.last_hidden_state.data, 2)).toEqual(row(first.last_hidden_state.data, 0));
      expect(row(again.last_hidden_state.data, 0)).toEqual(blue);
      expect(again.pooler_output.dims[0]).toBe(3);
      expect([...onlyEmpty.last_hidden_state.data]).toEqual(row(first.last_hidden_state.data, 0));
    } finally {
      await model.release();
    }
  });
});
