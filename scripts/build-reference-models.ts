/**
 * Builds the reference models (see src/reference/).
 *
 *   npm run build:reference-models -- --out <dir> [--family <name> ...]   one folder per family under <dir>
 *   npm run build:reference-models -- --default                          (re)writes models/demo-shapes
 */
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { buildDefaultModel, buildFamily, DEFAULT_MODEL_DIR, REFERENCE_FAMILIES, type BuildSummary } from '../src/reference/index.js';

function report(what: string, dir: string, summary: BuildSummary): void {
  console.log(`${what}: ${summary.files} files, ${(summary.bytes / 2 ** 20).toFixed(2)} MiB -> ${dir}`);
}

const { values } = parseArgs({
  options: {
    out: { type: 'string' },
    family: { type: 'string', multiple: true },
    default: { type: 'boolean', default: false },
    help: { type: 'boolean', short: 'h', default: false },
  },
});

if (values.help || (!values.out && !values.default)) {
  console.log(`usage: build-reference-models --out <dir> [--family <name> ...] | --default
families: ${REFERENCE_FAMILIES.join(', ')}`);
  process.exit(values.help ? 0 : 2);
}

if (values.out) {
  const families = values.family ?? REFERENCE_FAMILIES;
  for (const name of families) {
    const dir = join(values.out, name);
    report(name, dir, await buildFamily(name, dir));
  }
}
if (values.default) report('default model', DEFAULT_MODEL_DIR, await buildDefaultModel());
