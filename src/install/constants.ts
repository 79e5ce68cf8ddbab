/**
 * What the models commands name in their --help: here, apart from the modules that use them, which load
 * the Hub's client with its hashing WebAssembly (hub-client.ts) and the model families (model-files.ts),
 * so that a command's help loads neither.
 */

/** The Hub pulls come from unless HF_ENDPOINT (or --hub-url) names a mirror. */
export const DEFAULT_HUB_URL = 'https://huggingface.co';

/** The file that lists an installed model's files with their sizes and sha256 (see manifest.ts). */
export const MANIFEST_FILE = 'imagegen-manifest.json';
