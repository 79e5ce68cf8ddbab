/**
 * A float16 copy of a model folder (diffusers/Optimum layout): every `model.onnx` is converted, every
 * other file (configs, tokenizers, scheduler) is copied as is.
 */
import { chmod, copyFile, mkdir, readdir, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { convertOnnxBytesToFloat16, type Float16Options } from './convert.js';

export interface ConvertedComponent {
  /** Relative to the folder, e.g. `unet/model.onnx`. */
  file: string;
  milliseconds: number;
}

export async function convertFolderToFloat16(source: string, target: string, options: Float16Options = {}): Promise<ConvertedComponent[]> {
  const converted: ConvertedComponent[] = [];
  for (const entry of await readdir(source, { recursive: true, withFileTypes: true })) {
    if (!entry.isFile()) continue;
    const from = path.join(entry.parentPath, entry.name);
    const file = path.relative(source, from);
    const to = path.join(target, file);
    await mkdir(path.dirname(to), { recursive: true });
    if (entry.name.endsWith('.onnx')) {
      const started = performance.now();
      await writeFile(to, convertOnnxBytesToFloat16(await readFile(from), options));
      converted.push({ file, milliseconds: performance.now() - started });
    } else {
      await copyFile(from, to);
      // The copy keeps the source's mode, and a read-only source would make a read-only model folder.
      await chmod(to, 0o644);
    }
  }
  return converted;
}
