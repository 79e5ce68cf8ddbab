import path from 'node:path';
import { DENOISER_FOLDERS } from '../families/index.js';
import { MODEL_INDEX } from '../models/layout.js';
import { OVERRIDE_FILE } from '../models/model-folder.js';
import { isTensorRtEngine, tensorRtProblem } from '../models/tensorrt.js';
import { TOKENIZER_FILES } from '../tokenizers/files.js';
import { MANIFEST_FILE } from './constants.js';
import { ModelInstallError } from './errors.js';
import { plural } from '../util/plural.js';
import { printable } from '../util/printable.js';

/**
 * Which files of a repository or folder make up a diffusion ONNX export. Hub repositories often carry
 * the PyTorch weights, sample pictures and other exports next to the ONNX files; those are many
 * gigabytes the engine never reads, so pulls, imports and exports leave them out.
 */

/** Configuration, tokenizer and scheduler files, wherever they are. */
const SETTINGS_FILES = new Set([
  MODEL_INDEX,
  'config.json',
  'scheduler_config.json',
  ...TOKENIZER_FILES,
  // The server's per-model preset overrides (see model-folder.ts).
  OVERRIDE_FILE,
]);

/** Model licences and cards travel with the weights: some licences require it. */
const ROOT_DOCUMENTS = /^(readme\.md|licen[cs]e(\.\w+)?)$/i;

/** Weights in formats the engine cannot run, and pictures (TensorRT engines: see tensorrt.ts). */
const NOT_ONNX = /\.(safetensors|bin|ckpt|pt|pth|msgpack|h5|gguf|png|jpe?g|webp|gif)$/i;

export interface FileSelection {
  selected: string[];
  /** Not part of the export (the manifest is in neither list: installs rewrite it). */
  skipped: string[];
}

/** The graph every component is read from (layout.ts). */
const GRAPH = 'model.onnx';

/**
 * Whether `name` is, in a folder that has model.onnx, another export of the same component or its
 * external weights (model_fp16.onnx and model_fp16.onnx_data, model_quantized.onnx, as repositories made
 * for other runtimes ship them side by side): the engine reads model.onnx only, and a pull of such a
 * repository would download every variant, doubling the gigabytes or more.
 */
function isOtherGraph(name: string, folderGraphs: readonly string[]): boolean {
  if (!folderGraphs.includes(GRAPH)) return false;
  return folderGraphs.some((graph) => graph !== GRAPH && (name === graph || name.startsWith(`${graph}_`) || name.startsWith(`${graph}.`)));
}

/**
 * Splits relative paths (forward slashes) into the export's files and the rest. Besides the known
 * settings files, everything in a folder holding an `.onnx` graph is taken (but the other graphs beside
 * a model.onnx: see isOtherGraph): external weights have exporter-specific names (Optimum's
 * model.onnx_data, ORT/Olive's model.onnx.data, weights.pb, or one extension-less file per tensor), so
 * they cannot be listed by name.
 */
export function selectModelFiles(paths: string[]): FileSelection {
  const graphsIn = new Map<string, string[]>();
  for (const p of paths.filter((p) => p.endsWith('.onnx'))) {
    const folder = path.posix.dirname(p);
    graphsIn.set(folder, [...(graphsIn.get(folder) ?? []), path.posix.basename(p)]);
  }
  const wanted = (p: string) => {
    const name = path.posix.basename(p);
    const folder = path.posix.dirname(p);
    const folderGraphs = graphsIn.get(folder) ?? [];
    // Dot-files and dot-folders hold git attributes and `huggingface-cli download` metadata.
    if (p.split('/').some((part) => part.startsWith('.')) || NOT_ONNX.test(name) || isTensorRtEngine(name) || isOtherGraph(name, folderGraphs)) return false;
    return SETTINGS_FILES.has(name) || folderGraphs.length > 0 || (folder === '.' && ROOT_DOCUMENTS.test(name));
  };
  const candidates = paths.filter((p) => p !== MANIFEST_FILE);
  return { selected: candidates.filter(wanted), skipped: candidates.filter((p) => !wanted(p)) };
}

/** `files` split as selectModelFiles splits their paths: the export's own, and the paths of the rest. */
export function modelFilesOf<F extends { path: string }>(files: readonly F[]): { files: F[]; skipped: string[] } {
  const { selected, skipped } = selectModelFiles(files.map((file) => file.path));
  const wanted = new Set(selected);
  return { files: files.filter((file) => wanted.has(file.path)), skipped };
}

/** The note saying which files an install leaves out (printable: a pulled repository names its files). */
export function skippedNote(where: string, skipped: string[]): string {
  const shown = skipped.slice(0, 5).map(printable).join(', ') + (skipped.length > 5 ? ', ...' : '');
  return `${where}: skipping ${plural(skipped.length, 'file')} an ONNX export does not need: ${shown}\n`;
}

/** How an install names its source and the other places an export could be picked from. */
export interface ExportSource {
  /** The source as the user gave it (a repository and revision, a folder). */
  where: string;
  /** How to pick one of the export roots found deeper in the source (a path relative to it). */
  pick(root: string): string;
  /** What to do when there is neither an export nor one deeper (nor TensorRT engines). */
  otherwise: string;
}

/**
 * Fails before anything is downloaded or copied when the source's top is not an export's root (no
 * denoiser graph there), naming the folders deeper in it that are: a pull of the repository instead
 * of its onnx/ folder, or an import of the folder that holds several exports, would otherwise move
 * every byte first and then fail with advice to copy the model again.
 */
export function checkHasExport(source: ExportSource, selected: readonly string[], listed: readonly string[]): void {
  const graphs = DENOISER_FOLDERS.map((folder) => `${folder}/model.onnx`);
  if (graphs.some((graph) => selected.includes(graph))) return;
  const nested = new RegExp(`^(.+)/(${DENOISER_FOLDERS.join('|')})/model\\.onnx$`);
  const roots = [...new Set(listed.flatMap((file) => nested.exec(file)?.[1] ?? []))];
  const engines = listed.filter(isTensorRtEngine);
  const hint = roots.length ? `pick the export's folder: ${roots.map(source.pick).join(' or ')}` : engines.length ? tensorRtProblem(engines) : source.otherwise;
  throw new ModelInstallError(`${source.where} has no diffusers ONNX export (no ${graphs.join(' or ')}); ${hint}`);
}
