import { WIRE_FIXED32, WIRE_FIXED64, WIRE_LENGTH, WIRE_VARINT } from '../util/protobuf-wire.js';

/**
 * Reads a SentencePiece `spiece.model` (a `ModelProto` protobuf, sentencepiece_model.proto) into the
 * few fields a tokenizer needs. Hand-written because the format is four small messages and the
 * project has no protobuf library of its own (protobufjs only comes in through onnx-proto).
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

/** One protobuf field: its number, and its varint value or its bytes (length-delimited and fixed32). */
interface Field {
  number: number;
  value: bigint;
  bytes: Uint8Array;
}

function* fields(buffer: Uint8Array, what: string): Generator<Field> {
  let at = 0;
  const varint = (): bigint => {
    let value = 0n;
    for (let shift = 0n; ; shift += 7n) {
      if (at >= buffer.length) throw new Error(`${what}: truncated varint`);
      const byte = buffer[at++];
      value |= BigInt(byte & 0x7f) << shift;
      if (byte < 0x80) return value;
    }
  };
  const take = (length: number): Uint8Array => {
    if (at + length > buffer.length) throw new Error(`${what}: a field runs past the end of the file`);
    const bytes = buffer.subarray(at, at + length);
    at += length;
    return bytes;
  };
  while (at < buffer.length) {
    const key = varint();
    const number = Number(key >> 3n);
    const empty = new Uint8Array(0);
    switch (Number(key & 7n)) {
      case WIRE_VARINT:
        yield { number, value: varint(), bytes: empty };
        break;
      case WIRE_FIXED64:
        take(8);
        break;
      case WIRE_LENGTH:
        yield { number, value: 0n, bytes: take(Number(varint())) };
        break;
      case WIRE_FIXED32:
        yield { number, value: 0n, bytes: take(4) };
        break;
      default:
        throw new Error(`${what}: not a protobuf message (wire type ${key & 7n})`);
    }
  }
}

const utf8 = new TextDecoder('utf-8', { fatal: true });
const asFloat32 = (bytes: Uint8Array) => new DataView(bytes.buffer, bytes.byteOffset, 4).getFloat32(0, true);
/** int32 fields are varints of the 64-bit two's complement (-1 is ten bytes). */
const asInt32 = (value: bigint) => Number(BigInt.asIntN(32, value));

export function parseSentencePieceModel(buffer: Uint8Array, file: string): SentencePieceModel {
  const model: SentencePieceModel = {
    pieces: [],
    unkId: 0,
    byteFallback: false,
    precompiledCharsmap: new Uint8Array(0),
    addDummyPrefix: true,
  };
  let modelType = UNIGRAM;
  for (const field of fields(buffer, file)) {
    if (field.number === 1) {
      const piece: SentencePiece = { piece: '', score: 0, type: PieceType.normal };
      for (const f of fields(field.bytes, file)) {
        if (f.number === 1) piece.piece = utf8.decode(f.bytes);
        else if (f.number === 2) piece.score = asFloat32(f.bytes);
        else if (f.number === 3) piece.type = Number(f.value);
      }
      model.pieces.push(piece);
    } else if (field.number === 2) {
      // TrainerSpec
      for (const f of fields(field.bytes, file)) {
        if (f.number === 3) modelType = Number(f.value);
        else if (f.number === 35) model.byteFallback = f.value !== 0n;
        else if (f.number === 40) model.unkId = asInt32(f.value);
      }
    } else if (field.number === 3) {
      // NormalizerSpec
      for (const f of fields(field.bytes, file)) {
        if (f.number === 2) model.precompiledCharsmap = f.bytes;
        else if (f.number === 3) model.addDummyPrefix = f.value !== 0n;
      }
    }
  }
  if (modelType !== UNIGRAM) {
    throw new Error(`${file}: SentencePiece model type ${modelType} is not supported (only Unigram, as T5 uses)`);
  }
  if (model.pieces.length === 0) throw new Error(`${file}: the SentencePiece model has no pieces`);
  return model;
}
