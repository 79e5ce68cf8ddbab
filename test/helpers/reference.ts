import path from 'node:path';
import { inject } from 'vitest';

/** The folder of one reference model family, built by the global setup. */
export function referenceModel(family: string): string {
  return path.join(inject('referenceModelsDir'), family);
}
