import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';

/**
 * The layers of src/ (docs/design.md), each a folder, and imports only downwards: a module may import
 * from its own folder or from a folder of a lower rank. An import that runs back up is the first step
 * to a tangle where nothing can change alone, so it fails here, naming the file and the import.
 */
const RANK: Record<string, number> = {
  cli: 10,
  server: 9,
  http: 8,
  config: 7,
  observability: 7,
  service: 6.5,
  api: 6,
  install: 6,
  reference: 6,
  engine: 5,
  store: 4.5,
  pipelines: 4,
  models: 3,
  // Entries below models/, which reads folders with them; a family names its pipeline's kind, which
  // pipelines/load.ts maps to a constructor.
  families: 2.5,
  schedulers: 2,
  tokenizers: 2,
  runtime: 1,
  util: 0,
};

const SRC = path.resolve(import.meta.dirname, '../src');

/** `server.ts` -> `server`, `http/app.ts` -> `http`. */
const layerOf = (file: string) => path.relative(SRC, file).split(path.sep)[0].replace(/\.ts$/, '');

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const full = path.join(dir, entry.name);
    return entry.isDirectory() ? sourceFiles(full) : entry.name.endsWith('.ts') ? [full] : [];
  });
}

/** Relative imports (static, dynamic and `export ... from`) of a source file, as absolute .ts paths. */
function importsOf(file: string): string[] {
  const text = readFileSync(file, 'utf8');
  return [...text.matchAll(/(?:from|import\()\s*'(\.{1,2}\/[^']+)'/g)].map((m) => path.resolve(path.dirname(file), m[1]).replace(/\.js$/, '.ts'));
}

describe('layers', () => {
  const files = sourceFiles(SRC);

  it('gives every folder of src/ a rank', () => {
    expect([...new Set(files.map(layerOf))].filter((layer) => !(layer in RANK))).toEqual([]);
  });

  it('has every import point down (or stay in its own folder)', () => {
    const upward = files.flatMap((file) =>
      importsOf(file)
        .filter((target) => layerOf(target) !== layerOf(file) && RANK[layerOf(target)] >= RANK[layerOf(file)])
        .map((target) => `${path.relative(SRC, file)} imports ${path.relative(SRC, target)}`),
    );
    expect(upward).toEqual([]);
  });

  it('loads onnxruntime-node only through runtime/onnxruntime.ts, which turns its telemetry off first', () => {
    // Module imports; a child process's script (webgpu.test.ts's probe) gets the opt-out in its environment.
    const ROOT = path.dirname(SRC);
    const direct = [SRC, path.join(ROOT, 'bench'), path.join(ROOT, 'test')]
      .flatMap(sourceFiles)
      .filter((file) => /(?:from|import\()\s*'onnxruntime-node'/.test(readFileSync(file, 'utf8')))
      .map((file) => path.relative(ROOT, file));
    expect(direct).toEqual([path.join('src', 'runtime', 'onnxruntime.ts')]);
  });

  it('reads the imports it checks (so that an empty list above means something)', () => {
    const imports = importsOf(path.join(SRC, 'server.ts')).map((target) => path.relative(SRC, target));
    expect(imports).toContain(path.join('http', 'app.ts'));
    expect(imports.length).toBeGreaterThan(5);
  });
});
