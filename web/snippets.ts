import { extensionOf, imageFileName, type Fields, type ImageRequest } from './request.js';

/**
 * "Copy as code": the request that made an image, as curl, Python (openai-python) and Node (openai-node)
 * code. Each asks for b64_json and writes the picture to a file; the key comes from OPENAI_API_KEY, never
 * from the page, so a pasted snippet carries no secret.
 */

export interface Snippets {
  curl: string;
  python: string;
  node: string;
}

/** The keyword arguments openai-python declares per method; everything else goes in `extra_body`. */
const PYTHON_PARAMS: Record<ImageRequest['route'], ReadonlySet<string>> = {
  generations: new Set(['prompt', 'model', 'background', 'moderation', 'n', 'output_compression', 'output_format', 'quality', 'response_format', 'size', 'style', 'user']),
  edits: new Set(['prompt', 'model', 'background', 'input_fidelity', 'n', 'output_compression', 'output_format', 'quality', 'response_format', 'size', 'user']),
  variations: new Set(['model', 'n', 'response_format', 'size', 'user']),
};

const PYTHON_METHOD = { generations: 'generate', edits: 'edit', variations: 'create_variation' } as const;
const NODE_METHOD = { generations: 'generate', edits: 'edit', variations: 'createVariation' } as const;

/** A JSON string or number is also a Python and a JavaScript literal. */
const literal = (value: string | number): string => JSON.stringify(value);

/** Single-quoted for a POSIX shell. */
const shellQuote = (text: string): string => `'${text.replace(/'/g, `'\\''`)}'`;

/**
 * Two commands, curl then jq, each on lines of its own (no comment after a line continuation: zsh, the
 * macOS shell, reads `#` there as an argument). response.json stays, with the error if there was one.
 * The URL is quoted: an IPv6 origin's brackets ([::1]) are a glob, which zsh fails on ("no matches found").
 */
function curl(base: string, { route, fields, image, mask }: ImageRequest, file: string): string {
  const head = [`curl -sS ${shellQuote(`${base}/images/${route}`)}`, '-H "Authorization: Bearer $OPENAI_API_KEY"'];
  const save = `jq -r '.data[0].b64_json' response.json | base64 --decode > ${file}`;
  const body =
    route === 'generations'
      ? ['-H "Content-Type: application/json"', `-d ${shellQuote(JSON.stringify(fields))}`]
      : [
          ...[image && `-F image=@${imageFileName(image)}`, mask && '-F mask=@mask.png'].filter((f): f is string => Boolean(f)),
          // --form-string: a value starting with @ or < is sent as it is, never read from a file.
          ...Object.entries(fields).map(([name, value]) => `--form-string ${shellQuote(`${name}=${value}`)}`),
        ];
  return `${[...head, ...body, '-o response.json'].join(' \\\n  ')}\n${save}`;
}

function python(base: string, { route, fields, image, mask }: ImageRequest, file: string): string {
  const known = Object.entries(fields).filter(([name]) => PYTHON_PARAMS[route].has(name));
  const extra = Object.entries(fields).filter(([name]) => !PYTHON_PARAMS[route].has(name));
  const args = [
    ...(image ? [`image=open(${literal(imageFileName(image))}, "rb")`] : []),
    ...(mask ? ['mask=open("mask.png", "rb")'] : []),
    ...known.map(([name, value]) => `${name}=${literal(value)}`),
    // This server's extensions (seed, steps, ...) travel as extra body fields, as openai-python sends them.
    ...(extra.length ? [`extra_body={${extra.map(([name, value]) => `${literal(name)}: ${literal(value)}`).join(', ')}}`] : []),
  ];
  return [
    'import base64',
    'import os',
    '',
    'from openai import OpenAI',
    '',
    `client = OpenAI(base_url=${literal(base)}, api_key=os.environ.get("OPENAI_API_KEY", "none"))`,
    `result = client.images.${PYTHON_METHOD[route]}(`,
    ...args.map((arg) => `    ${arg},`),
    ')',
    `with open(${literal(file)}, "wb") as f:`,
    '    f.write(base64.b64decode(result.data[0].b64_json))',
    '',
  ].join('\n');
}

/**
 * A file the Node code uploads, read whole first: openai-node 7 sends a stream passed as it is while it
 * reads it, so it cannot send it again, and raises a 429 or 503 at once where it would have retried
 * (docs/api.md, openai-node versions).
 */
const nodeUpload = (name: string): string => `await toFile(fs.createReadStream('${name}'), '${name}')`;

function node(base: string, { route, fields, image, mask }: ImageRequest, file: string): string {
  const params = [
    ...(image ? [`image: ${nodeUpload(imageFileName(image))}`] : []),
    ...(mask ? [`mask: ${nodeUpload('mask.png')}`] : []),
    // openai-node sends every key of the params, this server's extensions (seed, steps, ...) included.
    ...Object.entries(fields).map(([name, value]) => `${name}: ${literal(value)}`),
  ];
  return [
    // An ES module (import, top-level await): node reads a .js file as CommonJS and fails on both.
    '// ES module: save as snippet.mjs (or set "type": "module" in package.json), npm install openai, run node snippet.mjs',
    "import fs from 'node:fs';",
    image ? "import OpenAI, { toFile } from 'openai';" : "import OpenAI from 'openai';",
    '',
    `const client = new OpenAI({ baseURL: ${literal(base)}, apiKey: process.env.OPENAI_API_KEY ?? 'none' });`,
    `const result = await client.images.${NODE_METHOD[route]}({`,
    ...params.map((param) => `  ${param},`),
    '});',
    `fs.writeFileSync(${literal(file)}, Buffer.from(result.data[0].b64_json, 'base64'));`,
    '',
  ].join('\n');
}

/** The snippets of a request (one image's: requestForImage) against the API at `base` (ending in /v1), answered as b64_json. */
export function snippetsOf(base: string, request: ImageRequest): Snippets {
  const fields: Fields = { ...request.fields, response_format: 'b64_json' };
  const exact = { ...request, fields };
  const file = `image-${fields.seed ?? 'out'}.${extensionOf(fields)}`;
  return { curl: curl(base, exact, file), python: python(base, exact, file), node: node(base, exact, file) };
}
