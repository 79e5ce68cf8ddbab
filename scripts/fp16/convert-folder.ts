/**
 * A float16 copy of a model folder (diffusers/Optimum layout): every `model.onnx` is converted, every
 * other file (configs, tokenizers, scheduler) is copied as is, but for the float32 weights files the
 * graphs read from beside them: a converted graph gets its own, of float16 numbers (external-data.ts).
 */
import { chmod, copyFile, mkdir, readdir, readFile, realpath, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import onnxProto from 'onnx-proto';
import { convertModelToFloat16, type Float16Options } from './convert.js';
import { externalTensors, moveExternalTensors } from './external-data.js';

const { onnx } = onnxProto;

export interface ConvertedComponent {
  /** Relative to the folder, e.g. `unet/model.onnx`. */
  file: string;
  milliseconds: number;
}

/** Converts the graph `from` into `to`; returns the external weights files of `from` it read (absolute). */
async function convertGraphFile(from: string, to: string, options: Float16Options): Promise<string[]> {
  const model = onnx.ModelProto.decode(await readFile(from));
  const external = externalTensors(model);
  convertModelToFloat16(model, options);
  // Optimum's name for a graph's weights file: model.onnx_data beside model.onnx.
  const read = await moveExternalTensors(external, path.dirname(path.resolve(from)), `${to}_data`);
  await writeFile(to, onnx.ModelProto.encode(model).finish());
  return read;
}

/**
 * The files under `dir`, through symbolic links: Hugging Face's cache keeps a snapshot's files as links
 * to its blobs/, and a folder assembled by hand may link its components in.
 */
async function filesUnder(dir: string, seen = new Set<string>()): Promise<string[]> {
  // A link back to a folder above would otherwise be walked forever.
  const real = await realpath(dir);
  if (seen.has(real)) return [];
  seen.add(real);
  const files: string[] = [];
  for (const name of await readdir(dir)) {
    const file = path.join(dir, name);
    const found = await stat(file);
    if (found.isDirectory()) files.push(...(await filesUnder(file, seen)));
    else if (found.isFile()) files.push(file);
  }
  return files;
}

export async function convertFolderToFloat16(source: string, target: string, options: Float16Options = {}): Promise<ConvertedComponent[]> {
  const files = await filesUnder(source);
  if (!files.some((file) => file.endsWith('.onnx'))) throw new Error(`${source} holds no .onnx graph to convert: name the export's folder (the one with unet/ or transformer/)`);
  const converted: ConvertedComponent[] = [];
  /** The source's external weights files, which the converted graphs replace with their own. */
  const replaced = new Set<string>();
  const targetOf = async (from: string) => {
    const to = path.join(target, path.relative(source, from));
    await mkdir(path.dirname(to), { recursive: true });
    return to;
  };
  for (const from of files.filter((file) => file.endsWith('.onnx'))) {
    const started = performance.now();
    for (const read of await convertGraphFile(from, await targetOf(from), options)) replaced.add(read);
    converted.push({ file: path.relative(source, from), milliseconds: performance.now() - started });
  }
  for (const from of files.filter((file) => !file.endsWith('.onnx') && !replaced.has(path.resolve(file)))) {
    const to = await targetOf(from);
    await copyFile(from, to);
    // The copy keeps the source's mode, and a read-only source would make a read-only model folder.
    await chmod(to, 0o644);
  }
  return converted;
}
