import type { FileHandle } from 'node:fs/promises';

/**
 * A reader of protobuf's wire format, for the two places that walk protobuf files by hand rather than
 * decode them whole: SentencePiece models (src/tokenizers/sentencepiece-model.ts) and ONNX graphs'
 * external-data references (src/models/onnx-external-data.ts, which must not read multi-GB weights).
 * Hand-written because both need only a few fields, and the graph walk must seek past weights that
 * a protobuf library would decode; the project has no protobuf library of its own either (protobufjs
 * only comes in through onnx-proto).
 */

/** The wire types a field's tag names (its low three bits) that this reader walks. */
export const WIRE_VARINT = 0;
const WIRE_FIXED64 = 1;
export const WIRE_LENGTH = 2;
export const WIRE_FIXED32 = 5;

/** The bytes are not a protobuf message, or are cut short; the message says which. */
export class WireFormatError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'WireFormatError';
  }
}

/** Where a reader gets its bytes: a buffer in memory or an open file. */
export interface WireSource {
  /** Up to `length` bytes from `pos`; fewer (or none) at the end of the data. */
  read(pos: number, length: number): Promise<Uint8Array>;
}

export const bufferSource = (buffer: Uint8Array): WireSource => ({
  read: async (pos, length) => buffer.subarray(pos, pos + length),
});

export const fileSource = (file: FileHandle): WireSource => ({
  read: async (pos, length) => {
    const buffer = Buffer.alloc(length);
    const { bytesRead } = await file.read(buffer, 0, length, pos);
    return buffer.subarray(0, bytesRead);
  },
});

/**
 * One field: its number, its wire type, its value when a varint, and where its bytes lie when it has
 * bytes (length-delimited, fixed32, fixed64). `start` and `end` are positions in the source.
 */
export interface WireField {
  number: number;
  wire: number;
  value: bigint;
  start: number;
  end: number;
}

/** Big enough for a run of field headers, small enough that a seek past weights reads little. */
const WINDOW_BYTES = 16 * 1024;

/**
 * Reads forwards through a window of the source, so that skipping a field's bytes costs no I/O: a
 * message's fields are walked with fields(), and a field's bytes read with bytes() only when wanted.
 */
export class WireReader {
  /** Where the next field header is read. */
  pos = 0;
  private window: Uint8Array = new Uint8Array(0);
  private windowStart = 0;

  constructor(private readonly source: WireSource) {}

  private async byte(): Promise<number> {
    const offset = this.pos - this.windowStart;
    if (offset < 0 || offset >= this.window.length) {
      this.window = await this.source.read(this.pos, WINDOW_BYTES);
      this.windowStart = this.pos;
      if (this.window.length === 0) throw new WireFormatError('truncated varint');
    }
    return this.window[this.pos++ - this.windowStart];
  }

  /** A base-128 varint; int32 and int64 fields are varints of their 64-bit two's complement. */
  async varint(): Promise<bigint> {
    let value = 0n;
    for (let shift = 0n; shift < 70n; shift += 7n) {
      const byte = await this.byte();
      value |= BigInt(byte & 0x7f) << shift;
      if (byte < 0x80) return value;
    }
    throw new WireFormatError('a varint longer than ten bytes');
  }

  /** The bytes of a field (`start` to `end`), read in full. */
  async bytes(field: Pick<WireField, 'start' | 'end'>): Promise<Uint8Array> {
    const length = field.end - field.start;
    const bytes = await this.source.read(field.start, length);
    if (bytes.length < length) throw new WireFormatError('a field runs past the end of the file');
    return bytes;
  }

  /**
   * The fields of the message that runs from `pos` to `end`. The caller may read inside a field (its
   * sub-message, with fields(field.end)); whatever it read, the walk goes on after the field.
   */
  async *fields(end: number): AsyncGenerator<WireField> {
    while (this.pos < end) {
      const key = await this.varint();
      const number = Number(key >> 3n);
      const wire = Number(key & 7n);
      // No message has a field 0, and protobuf's parsers (onnxruntime's) refuse one: a run of zero bytes
      // (a file padded, or a copy's unwritten tail) would otherwise walk as empty fields 0 to the end.
      if (number === 0) throw new WireFormatError('a field numbered 0: zero bytes where a field belongs');
      let field: WireField;
      if (wire === WIRE_VARINT) {
        const value = await this.varint();
        field = { number, wire, value, start: this.pos, end: this.pos };
      } else if (wire === WIRE_LENGTH || wire === WIRE_FIXED64 || wire === WIRE_FIXED32) {
        const length = wire === WIRE_LENGTH ? Number(await this.varint()) : wire === WIRE_FIXED64 ? 8 : 4;
        field = { number, wire, value: 0n, start: this.pos, end: this.pos + length };
        if (field.end > end) throw new WireFormatError('a field runs past the end of its message');
      } else {
        // Groups (wire types 3 and 4) are long deprecated and in neither format.
        throw new WireFormatError(`not a protobuf message (wire type ${wire})`);
      }
      yield field;
      this.pos = field.end;
    }
  }
}

/** The fields of the message running to `end` that hold bytes (sub-messages, strings) and have field number `number`. */
export async function* lengthFields(reader: WireReader, end: number, number: number): AsyncGenerator<WireField> {
  for await (const field of reader.fields(end)) if (field.number === number && field.wire === WIRE_LENGTH) yield field;
}
