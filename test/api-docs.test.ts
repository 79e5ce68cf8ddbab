import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { ApiError } from '../src/api/errors.js';
import { parseImageRequest, REQUEST_FIELD_NAMES, type RequestKind } from '../src/api/wire.js';
import { Metrics } from '../src/observability/metrics.js';
import { PROJECT_ROOT } from './helpers/cli.js';
import { DOCS, section, tableRows } from './helpers/docs.js';

/**
 * docs/api.md's tables of request fields, error codes and metrics are what clients and operators build
 * on: each route's field table names the fields that route takes, and no other; every `code` the server
 * answers with is in the Errors table, every code there is one it answers with; and every metric it
 * exports is in the Metrics table with its type, and no other. A field, code or metric added, renamed or
 * dropped without its row fails here, naming it.
 */

const api = DOCS.get(path.join('docs', 'api.md'))!;

/** The layers that turn failures into answers (src/http, src/service, src/api): their sources, by file. */
const answerSources = ['http', 'service', 'api'].flatMap((folder) =>
  readdirSync(path.join(PROJECT_ROOT, 'src', folder))
    .filter((name) => name.endsWith('.ts'))
    .map((name) => readFileSync(path.join(PROJECT_ROOT, 'src', folder, name), 'utf8')),
);

/** The codes the sources write out: `code: 'x'` (an ApiError's options, a zod issue's params) and ApiError.invalid(param, 'x', ...). */
const writtenCodes = new Set(
  answerSources.flatMap((source) => [...source.matchAll(/\bcode: '([a-z][a-z0-9_]*)'/g), ...source.matchAll(/ApiError\.invalid\(\s*[^,]+,\s*'([a-z][a-z0-9_]*)'/g)].map(([, code]) => code)),
);

/** The codes of OpenAI's bounds messages, which wire.ts composes (`integer_above_max_value`, ...): from requests past each kind of bound. */
function composedCodes(): Set<string> {
  const pastBounds = [{ n: 0 }, { n: 11 }, { guidance_scale: -1 }, { guidance_scale: 31 }, { size: 'x'.repeat(33) }, { prompt: '' }];
  return new Set(
    pastBounds.map((fields) => {
      try {
        parseImageRequest('generation', { model: 'm', prompt: 'p', ...fields });
      } catch (err) {
        if (err instanceof ApiError) return String(err.code);
        throw err;
      }
      throw new Error(`${JSON.stringify(fields)} was taken`);
    }),
  );
}

/** The codes of the Errors table (its third column), with its `type` values left out. */
const documentedCodes = new Set(
  tableRows(section(api, '## Errors'))
    .filter(([status]) => /^\d/.test(status))
    .flatMap(([, , codes]) => [...codes.replace(/type `[a-z_]+`/g, '').matchAll(/`([a-z][a-z0-9_]*)`/g)].map(([, code]) => code)),
);

describe("docs/api.md's Errors table", () => {
  const emitted = new Set([...writtenCodes, ...composedCodes()]);

  it('has every code the server answers with', () => {
    expect(emitted.size).toBeGreaterThan(40);
    expect([...emitted].filter((code) => !documentedCodes.has(code))).toEqual([]);
  });

  it('has no code the server does not answer with', () => {
    expect([...documentedCodes].filter((code) => !emitted.has(code))).toEqual([]);
  });
});

describe("docs/api.md's Metrics table", () => {
  // `imagegen_store_images`, `imagegen_store_bytes` | gauge: one type for the names of a row; `imagegen_process_*`: prom-client's own.
  const rows = tableRows(api)
    .filter(([names]) => names.startsWith('`imagegen_'))
    .map(([names, type]) => ({ names: [...names.matchAll(/`([a-z_*]+)`/g)].map(([, name]) => name), type }));
  const names = (pattern: string, name: string) => (pattern.endsWith('*') ? name.startsWith(pattern.slice(0, -1)) : name === pattern);
  const documented = (name: string) => rows.find((row) => row.names.some((pattern) => names(pattern, name)));

  it('names every metric /metrics exports, with its type', async () => {
    const exported = await new Metrics().registry.getMetricsAsJSON();
    expect(exported.length).toBeGreaterThan(20);
    const wrong = exported.flatMap(({ name, type }) => {
      const row = documented(name);
      if (!row) return [`${name} (${type}) is not in the table`];
      return row.type === '' || row.type === String(type) ? [] : [`${name} is a ${type}, documented as a ${row.type}`];
    });
    expect(wrong).toEqual([]);
  });

  it('names no metric /metrics does not export', async () => {
    const exported = (await new Metrics().registry.getMetricsAsJSON()).map(({ name }) => name);
    expect(rows.flatMap((row) => row.names).filter((pattern) => !exported.some((name) => names(pattern, name)))).toEqual([]);
  });
});

describe("docs/api.md's field tables", () => {
  // The pictures travel beside the fields (src/http/uploads.ts), not in the schema of each route's fields.
  const FILES = ['image', 'image[]', 'images', 'mask'];
  const routes: Record<RequestKind, string> = {
    generation: '## POST /v1/images/generations',
    edit: '## POST /v1/images/edits',
    variation: '## POST /v1/images/variations',
  };

  /** The fields the first table of a route's section names in its first column (`n`, `model`, ... in one cell too). */
  function documentedFields(heading: string): string[] {
    const lines = section(api, heading).split('\n');
    const start = lines.findIndex((line) => line.startsWith('| '));
    const end = lines.findIndex((line, i) => i > start && !line.startsWith('|'));
    return tableRows(lines.slice(start, end).join('\n')).flatMap(([first]) => [...first.matchAll(/`([a-z_[\]]+)`/g)].map(([, name]) => name));
  }

  it.each(Object.entries(routes) as [RequestKind, string][])('of %s requests name every field the route takes, and no other', (kind, heading) => {
    const documented = documentedFields(heading).filter((name) => !FILES.includes(name));
    const taken = [...REQUEST_FIELD_NAMES[kind]];
    expect(taken.length).toBeGreaterThan(10);
    expect({ undocumented: taken.filter((name) => !documented.includes(name)), notTaken: documented.filter((name) => !taken.includes(name)) }).toEqual({
      undocumented: [],
      notTaken: [],
    });
  });
});
