import path from 'node:path';
import { EMBEDDED_MODELS_DIR } from '../../src/config.js';
import type { GenerationBatch } from '../../src/runtime/types.js';

/** The embedded demo model's folder (the default model), for tests and benchmarks that run it directly. */
export const DEMO_MODEL_DIR = path.join(EMBEDDED_MODELS_DIR, 'demo-shapes');

/** A batch of the demo model as the requests' defaults make it (one 512x512 image, 4 steps), with `settings` over them. */
export const demoBatch = (settings: Partial<GenerationBatch> = {}): GenerationBatch => ({
  modelDir: DEMO_MODEL_DIR,
  width: 512,
  height: 512,
  steps: 4,
  guidanceScale: 0,
  items: [{ prompt: 'a red circle', negativePrompt: '', seed: 1 }],
  ...settings,
});
