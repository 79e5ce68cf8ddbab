/**
 * Protobuf's wire types, for the two readers that walk protobuf files by hand rather than decode them
 * whole: SentencePiece models (src/tokenizers/sentencepiece-model.ts) and ONNX graphs' external-data
 * references (src/models/onnx-external-data.ts, which must not read multi-GB weights).
 */
export const WIRE_VARINT = 0;
export const WIRE_FIXED64 = 1;
export const WIRE_LENGTH = 2;
export const WIRE_FIXED32 = 5;
