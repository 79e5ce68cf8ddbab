import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm, symlink } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadTokenizer } from '../src/tokenizers/load.js';
import type { TextTokenizer } from '../src/tokenizers/tokenizer.js';

/**
 * Every prompt of the real exports' tokenizer goldens (ids from transformers' own tokenizer classes)
 * through loadTokenizer on the very files the exports ship, at every row length the goldens give.
 */

const here = path.dirname(fileURLToPath(import.meta.url));
const REAL_EXPORTS = path.resolve(here, '../../shared/data/real-exports');
const EXPORTS = path.join(REAL_EXPORTS, 'exports');
const GOLDENS = path.join(REAL_EXPORTS, 'goldens/tokenizer-ids.json');
// The same CLIP vocabulary as published with SD models, as tokenizer.json (fast-tokenizer) files.
const CLIP_JSON = path.resolve(here, '../../shared/data/clip-tokenizers');
const haveGoldens = existsSync(GOLDENS);

interface GoldenCase {
  prompt: string;
  untruncated_ids: number[];
  /** `input_ids_77` for CLIP, `input_ids_256` and `input_ids_512` for T5. */
  [paddedKey: `input_ids_${number}`]: number[];
}

interface GoldenTokenizer {
  folders: string[];
  class_used: string;
  pad_token_id: number;
  cases: GoldenCase[];
}

interface Goldens {
  tokenizers: GoldenTokenizer[];
}

if (!haveGoldens) {
  console.warn(`skipping the tokenizer golden tests: ${GOLDENS} (the shared test data) is absent`);
}

const goldens: Goldens = haveGoldens ? (JSON.parse(readFileSync(GOLDENS, 'utf8')) as Goldens) : { tokenizers: [] };

/** The row lengths a case gives padded ids for, from its `input_ids_<n>` keys. */
function rowLengths(golden: GoldenCase): number[] {
  return Object.keys(golden)
    .map((key) => /^input_ids_(\d+)$/.exec(key)?.[1])
    .filter((length): length is string => length !== undefined)
    .map(Number);
}

// Generous enough for every prompt untruncated: the row then shows the untruncated ids and the padding.
const UNTRUNCATED = 1024;

/** Loads each folder once per row length; T5's tokenizer.json takes a while to read. */
const loaded = new Map<string, Promise<TextTokenizer>>();
function tokenizerFor(folder: string, maxLength: number): Promise<TextTokenizer> {
  const key = `${folder}@${maxLength}`;
  if (!loaded.has(key)) loaded.set(key, loadTokenizer(folder, { maxLength }));
  return loaded.get(key) as Promise<TextTokenizer>;
}

function checkFolder(label: string, folder: () => string, golden: GoldenTokenizer) {
  describe(label, () => {
    it.each(golden.cases.map((c) => [JSON.stringify(c.prompt).slice(0, 60), c] as const))('%s', async (_name, c) => {
      for (const length of rowLengths(c)) {
        const tokenizer = await tokenizerFor(folder(), length);
        expect(tokenizer.padId).toBe(golden.pad_token_id);
        expect(tokenizer.encode(c.prompt), `padded to ${length}`).toEqual(c[`input_ids_${length}`]);
      }
      const long = (await tokenizerFor(folder(), UNTRUNCATED)).encode(c.prompt);
      const padding = new Array<number>(UNTRUNCATED - c.untruncated_ids.length).fill(golden.pad_token_id);
      expect(long, 'untruncated').toEqual([...c.untruncated_ids, ...padding]);
    });
  });
}

describe.skipIf(!haveGoldens)('tokenizers against the goldens (needs ../shared/data/real-exports)', () => {
  let onlySpiece: string;
  let onlyTokenizerJson: string;

  beforeAll(async () => {
    // FLUX's T5 folder ships both spiece.model and tokenizer.json; each must give the ids on its own.
    const t5 = path.join(EXPORTS, 'flux/tokenizer_2');
    const configs = ['tokenizer_config.json', 'special_tokens_map.json', 'added_tokens.json'];
    onlySpiece = await linkedFolder('t5-spiece-', t5, ['spiece.model', ...configs]);
    onlyTokenizerJson = await linkedFolder('t5-json-', t5, ['tokenizer.json', ...configs]);
  });
  afterAll(async () => {
    await rm(onlySpiece, { recursive: true, force: true });
    await rm(onlyTokenizerJson, { recursive: true, force: true });
  });

  it('gives T5 added tokens typed in a prompt their ids, the same from either file', async () => {
    const fromSpiece = await tokenizerFor(onlySpiece, 32);
    const fromJson = await tokenizerFor(onlyTokenizerJson, 32);
    for (const prompt of ['a <extra_id_0> b', 'hello</s>', '</s> x <pad> <unk>', 'a<extra_id_99>b']) {
      expect(fromSpiece.encode(prompt), prompt).toEqual(fromJson.encode(prompt));
    }
    // "a" is ▁ a (3, 9); <extra_id_0> eats the spaces around it, so "b" comes without ▁ (115).
    expect(fromSpiece.encode('a <extra_id_0> b').slice(0, 5)).toEqual([3, 9, 32099, 115, 1]);
  });

  for (const golden of goldens.tokenizers) {
    for (const folder of golden.folders) {
      if (folder === 'flux/tokenizer_2') {
        checkFolder(`${folder} from spiece.model alone`, () => onlySpiece, golden);
        checkFolder(`${folder} from tokenizer.json alone`, () => onlyTokenizerJson, golden);
      } else {
        checkFolder(`${folder} (${golden.class_used})`, () => path.join(EXPORTS, folder), golden);
      }
    }
  }

  // The published tokenizer.json files of the same CLIP vocabulary: SD 1.5 pads with eos, SDXL's
  // second tokenizer with "!".
  const clipWithPad = (padId: number) =>
    goldens.tokenizers.find((t) => t.class_used === 'CLIPTokenizer' && t.pad_token_id === padId);
  const clipEos = clipWithPad(49407);
  const clipBang = clipWithPad(0);
  if (clipEos) checkFolder('clip-tokenizers/sd-1.5 tokenizer.json', () => path.join(CLIP_JSON, 'sd-1.5'), clipEos);
  if (clipBang) checkFolder('clip-tokenizers/sdxl-turbo-2 tokenizer.json', () => path.join(CLIP_JSON, 'sdxl-turbo-2'), clipBang);
});

/** A temporary folder with links to some of `source`'s files. */
async function linkedFolder(prefix: string, source: string, files: string[]): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), prefix));
  for (const file of files) await symlink(path.join(source, file), path.join(dir, file));
  return dir;
}
