import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

/** onnxruntime-node's folder of native libraries for this system, where `npm run install:cuda` puts the CUDA provider's. */
export const ortBinFolder = path.join(path.dirname(createRequire(import.meta.url).resolve('onnxruntime-node')), '..', 'bin', 'napi-v6', process.platform, process.arch);

/** npm ci skips the CUDA provider libraries; after `npm run install:cuda` this machine may have them. */
export const cudaInstalled = existsSync(path.join(ortBinFolder, 'libonnxruntime_providers_cuda.so'));
