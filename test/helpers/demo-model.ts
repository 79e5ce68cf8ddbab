import path from 'node:path';
import { EMBEDDED_MODELS_DIR } from '../../src/config.js';

/** The embedded demo model's folder (the default model), for tests and benchmarks that run it directly. */
export const DEMO_MODEL_DIR = path.join(EMBEDDED_MODELS_DIR, 'demo-shapes');
