import { open, stat, type FileHandle } from 'node:fs/promises';
import path from 'node:path';
import { formatBytes } from '../util/bytes.js';
import { WIRE_FIXED32, WIRE_FIXED64, WIRE_LENGTH, WIRE_VARINT } from '../util/protobuf-wire.js';

/**
 * The external weight files an ONNX graph reads, found without loading it. Exporters save graphs over
 * 2 GB with their weights beside them under a name stored in the graph (Optimum: `model.onnx_data`,
 * ORT/Olive: `model.onnx.data`, older scripts: `weights.pb`); onnxruntime only says "file not found"
 * deep inside session creation when one was not copied. Walking the protobuf's field headers finds the
 * names and extents, reading a few bytes per initializer: an inline multi-GB graph's weights are
 * skipped by seeking, never read.
 */

/** ModelProto.graph, GraphProto.initializer, TensorProto.external_data, StringStringEntryProto key/value. */
const MODEL_GRAPH = 7;
const GRAPH_INITIALIZER = 5;
const TENSOR_EXTERNAL_DATA = 13;
const ENTRY_KEY = 1;
const ENTRY_VALUE = 2;

/** Big enough for a run of node or initializer headers, small enough that a seek past weights reads little. */
const WINDOW_BYTES = 16 * 1024;
/** A file name or a decimal number: anything longer means the bytes are not what they seem. */
const MAX_TEXT_BYTES = 4096;

/** The file is not a protobuf (or is cut short): nothing more can be learnt from its headers. */
class Malformed extends Error {}

/** Reads forwards through a window of the file, so that skipping a field's bytes costs no I/O. */
class Cursor {
  pos = 0;
  private readonly window = Buffer.alloc(WINDOW_BYTES);
  private start = 0;
  private length = 0;

  constructor(private readonly file: FileHandle) {}

  private async byte(): Promise<number> {
    if (this.pos < this.start || this.pos >= this.start + this.length) {
      const { bytesRead } = await this.file.read(this.window, 0, WINDOW_BYTES, this.pos);
      if (bytesRead === 0) throw new Malformed();
      this.start = this.pos;
      this.length = bytesRead;
    }
    return this.window[this.pos++ - this.start];
  }

  /** Exact below 2^53, which every length and offset in a file is. */
  async varint(): Promise<number> {
    let value = 0;
    for (let scale = 1; scale < 2 ** 64; scale *= 128) {
      const b = await this.byte();
      value += (b & 0x7f) * scale;
      if (b < 0x80) return value;
    }
    throw new Malformed();
  }

  async text(bytes: number): Promise<string> {
    if (bytes > MAX_TEXT_BYTES) throw new Malformed();
    const buffer = Buffer.alloc(bytes);
    const { bytesRead } = await this.file.read(buffer, 0, bytes, this.pos);
    if (bytesRead < bytes) throw new Malformed();
    this.pos += bytes;
    return buffer.toString('utf8');
  }
}

/**
 * Calls `visit` for each length-delimited field of the message ending at `end`, with the cursor at
 * its value; whatever `visit` read, the walk goes on after the field. Other fields are skipped.
 */
async function eachField(cursor: Cursor, end: number, visit: (field: number, valueEnd: number) => Promise<void>): Promise<void> {
  while (cursor.pos < end) {
    const key = await cursor.varint();
    const wire = key & 7;
    if (wire === WIRE_VARINT) await cursor.varint();
    else if (wire === WIRE_FIXED64) cursor.pos += 8;
    else if (wire === WIRE_FIXED32) cursor.pos += 4;
    else if (wire === WIRE_LENGTH) {
      const length = await cursor.varint();
      const valueEnd = cursor.pos + length;
      if (valueEnd > end) throw new Malformed();
      await visit(Math.floor(key / 8), valueEnd);
      cursor.pos = valueEnd;
    } else throw new Malformed(); // groups: not in ONNX
  }
}

/** One external weights file of a graph. */
export interface ExternalDataFile {
  /** As the graph names it: relative to the graph's folder. */
  location: string;
  /** The end of the furthest tensor the graph reads from it: a shorter file is truncated. */
  bytesNeeded: number;
}

/** A tensor's external_data entries (location, offset, length), skipping its raw_data. */
async function externalEntries(cursor: Cursor, tensorEnd: number): Promise<Map<string, string>> {
  const entries = new Map<string, string>();
  await eachField(cursor, tensorEnd, async (field, entryEnd) => {
    if (field !== TENSOR_EXTERNAL_DATA) return;
    let key = '';
    let value = '';
    await eachField(cursor, entryEnd, async (part, partEnd) => {
      if (part === ENTRY_KEY) key = await cursor.text(partEnd - cursor.pos);
      if (part === ENTRY_VALUE) value = await cursor.text(partEnd - cursor.pos);
    });
    entries.set(key, value);
  });
  return entries;
}

/**
 * The external files the initializers of `onnxFile` read. A file that is not a protobuf, or is cut
 * short, gives what was found before the damage: loading it names the damage better.
 */
export async function externalDataFiles(onnxFile: string): Promise<ExternalDataFile[]> {
  const needed = new Map<string, number>();
  const file = await open(onnxFile);
  try {
    const cursor = new Cursor(file);
    await eachField(cursor, (await file.stat()).size, async (field, graphEnd) => {
      if (field !== MODEL_GRAPH) return;
      await eachField(cursor, graphEnd, async (part, tensorEnd) => {
        if (part !== GRAPH_INITIALIZER) return;
        const entries = await externalEntries(cursor, tensorEnd);
        const location = entries.get('location');
        if (location === undefined) return;
        const end = (Number(entries.get('offset')) || 0) + (Number(entries.get('length')) || 0);
        needed.set(location, Math.max(needed.get(location) ?? 0, end));
      });
    });
  } catch (err) {
    if (!(err instanceof Malformed)) throw err;
  } finally {
    await file.close();
  }
  return [...needed].map(([location, bytesNeeded]) => ({ location, bytesNeeded }));
}

/**
 * Why the graph `onnxFile` cannot load for want of its external weights (paths relative to the model
 * folder `root`), or undefined when they are all there in full.
 */
export async function externalDataProblem(onnxFile: string, root: string): Promise<string | undefined> {
  const graph = path.relative(root, onnxFile);
  const problems: string[] = [];
  for (const { location, bytesNeeded } of await externalDataFiles(onnxFile)) {
    const weights = path.resolve(path.dirname(onnxFile), location);
    const name = path.relative(root, weights);
    const size = (await stat(weights).catch(() => undefined))?.size;
    if (size === undefined) {
      problems.push(`${graph} keeps its weights in ${name}, which is missing: copy it from the export too (exporters write it next to the graph, under the name the graph records)`);
    } else if (size < bytesNeeded) {
      problems.push(`${name} is truncated (${formatBytes(size)}; ${graph} reads ${formatBytes(bytesNeeded)} of it): copy it again`);
    }
  }
  return problems.length ? problems.join('; ') : undefined;
}
