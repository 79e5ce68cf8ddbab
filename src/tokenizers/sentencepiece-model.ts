import { bufferSource, WIRE_FIXED32, WIRE_LENGTH, WIRE_VARINT, WireFormatError, WireReader, type WireField } from '../util/protobuf-wire.js';

/**
 * Reads a SentencePiece `spiece.model` (a `ModelProto` protobuf, sentencepiece_model.proto) into the
 * few fields a tokenizer needs, with the project's protobuf field reader (src/util/protobuf-wire.ts):
 * the format is four small messages.
 */

/** sentencepiece_model.proto `SentencePiece.Type`. */
export const PieceType = { normal: 1, unknown: 2, control: 3, userDefined: 4 } as const;

/** sentencepiece_model.proto `TrainerSpec.ModelType`. */
const UNIGRAM = 1;

export interface SentencePiece {
  piece: string;
  score: number;
  type: number;
}

export interface SentencePieceModel {
  pieces: SentencePiece[];
  unkId: number;
  byteFallback: boolean;
  /** `NormalizerSpec.precompiled_charsmap`: the compiled normalisation rules, empty when there are none. */
  precompiledCharsmap: Uint8Array;
  /** `NormalizerSpec.add_dummy_prefix`: whether text is given a leading space (so a leading `▁`). */
  addDummyPrefix: boolean;
}

const utf8 = new TextDecoder('utf-8', { fatal: true });
const asFloat32 = (bytes: Uint8Array) => new DataView(bytes.buffer, bytes.byteOffset, 4).getFloat32(0, true);
/** int32 fields are varints of the 64-bit two's complement (-1 is ten bytes). */
const asInt32 = (value: bigint) => Number(BigInt.asIntN(32, value));

/** Whether a field is number `number` of wire type `wire` (a field of another type is someone else's). */
const is = (field: WireField, number: number, wire: number) => field.number === number && field.wire === wire;

export async function parseSentencePieceModel(buffer: Uint8Array, file: string): Promise<SentencePieceModel> {
  const model: SentencePieceModel = {
    pieces: [],
    unkId: 0,
    byteFallback: false,
    precompiledCharsmap: new Uint8Array(0),
    addDummyPrefix: true,
  };
  let modelType = UNIGRAM;
  const reader = new WireReader(bufferSource(buffer));
  try {
    for await (const field of reader.fields(buffer.length)) {
      if (is(field, 1, WIRE_LENGTH)) {
        const piece: SentencePiece = { piece: '', score: 0, type: PieceType.normal };
        for await (const f of reader.fields(field.end)) {
          if (is(f, 1, WIRE_LENGTH)) piece.piece = utf8.decode(await reader.bytes(f));
          else if (is(f, 2, WIRE_FIXED32)) piece.score = asFloat32(await reader.bytes(f));
          else if (is(f, 3, WIRE_VARINT)) piece.type = Number(f.value);
        }
        model.pieces.push(piece);
      } else if (is(field, 2, WIRE_LENGTH)) {
        // TrainerSpec
        for await (const f of reader.fields(field.end)) {
          if (is(f, 3, WIRE_VARINT)) modelType = Number(f.value);
          else if (is(f, 35, WIRE_VARINT)) model.byteFallback = f.value !== 0n;
          else if (is(f, 40, WIRE_VARINT)) model.unkId = asInt32(f.value);
        }
      } else if (is(field, 3, WIRE_LENGTH)) {
        // NormalizerSpec
        for await (const f of reader.fields(field.end)) {
          if (is(f, 2, WIRE_LENGTH)) model.precompiledCharsmap = await reader.bytes(f);
          else if (is(f, 3, WIRE_VARINT)) model.addDummyPrefix = f.value !== 0n;
        }
      }
    }
  } catch (err) {
    if (err instanceof WireFormatError) throw new Error(`${file}: ${err.message}`);
    throw err;
  }
  if (modelType !== UNIGRAM) {
    throw new Error(`${file}: SentencePiece model type ${modelType} is not supported (only Unigram, as T5 uses)`);
  }
  if (model.pieces.length === 0) throw new Error(`${file}: the SentencePiece model has no pieces`);
  return model;
}
