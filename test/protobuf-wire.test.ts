import { mkdtemp, open, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { bufferSource, fileSource, WIRE_FIXED32, WIRE_LENGTH, WIRE_VARINT, WireFormatError, WireReader, type WireField } from '../src/util/protobuf-wire.js';

/** A protobuf message written by hand: field 1 = varint 300, field 2 = { field 1 = "hi" }, field 3 = fixed32, field 4 = int32 -1. */
const MESSAGE = Uint8Array.from([
  0x08, 0xac, 0x02, // 1: varint 300
  0x12, 0x04, 0x0a, 0x02, 0x68, 0x69, // 2: bytes { 1: "hi" }
  0x1d, 0x00, 0x00, 0x80, 0x3f, // 3: fixed32 1.0f
  0x20, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, // 4: int32 -1 (ten bytes)
]);

type Seen = Omit<WireField, 'start' | 'end'> & { text?: string };

async function walk(reader: WireReader, end: number): Promise<Seen[]> {
  const seen: Seen[] = [];
  for await (const { number, wire, value, end: fieldEnd } of reader.fields(end)) {
    if (number === 2) {
      for await (const inner of reader.fields(fieldEnd)) {
        seen.push({ number: inner.number, wire: inner.wire, value: inner.value, text: Buffer.from(await reader.bytes(inner)).toString() });
      }
    }
    seen.push({ number, wire, value });
  }
  return seen;
}

describe('protobuf wire reader', () => {
  let dir: string | undefined;
  afterAll(() => dir && rm(dir, { recursive: true, force: true }));

  const expected = [
    { number: 1, wire: WIRE_VARINT, value: 300n },
    { number: 1, wire: WIRE_LENGTH, value: 0n, text: 'hi' },
    { number: 2, wire: WIRE_LENGTH, value: 0n },
    { number: 3, wire: WIRE_FIXED32, value: 0n },
    { number: 4, wire: WIRE_VARINT, value: 2n ** 64n - 1n },
  ];

  it('walks fields and sub-messages of a buffer, whatever the caller read inside a field', async () => {
    expect(await walk(new WireReader(bufferSource(MESSAGE)), MESSAGE.length)).toEqual(expected);
  });

  it('reads a file the same way', async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'imagegen-wire-'));
    const file = path.join(dir, 'message.pb');
    await writeFile(file, MESSAGE);
    const handle = await open(file);
    try {
      expect(await walk(new WireReader(fileSource(handle)), MESSAGE.length)).toEqual(expected);
    } finally {
      await handle.close();
    }
  });

  it('names the damage: a cut varint, a field past its message, a wire type protobuf lacks', async () => {
    const fail = async (bytes: number[]) => {
      const reader = new WireReader(bufferSource(Uint8Array.from(bytes)));
      const error = await walk(reader, bytes.length).then(() => undefined, (err: unknown) => err);
      expect(error).toBeInstanceOf(WireFormatError);
      return (error as Error).message;
    };
    expect(await fail([0x08, 0xac])).toMatch(/truncated varint/);
    expect(await fail([0x12, 0x05, 0x0a])).toMatch(/runs past the end/);
    expect(await fail([0x0b])).toMatch(/wire type 3/);
  });
});
