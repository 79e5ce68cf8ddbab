import OpenAI from 'openai';
import sharp from 'sharp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startTestServer, TEST_KEY, type TestServer } from './helpers/api-server.js';

/** What raw HTTP clients can send that the SDK never would: every answer is an OpenAI error body. */

let server: TestServer;
beforeAll(async () => {
  // Its model can edit: the form tests below send edits that must run.
  server = await startTestServer({ stubCanEdit: true });
});
afterAll(() => server.close());

const auth = { authorization: `Bearer ${TEST_KEY}` };

async function post(body: string | Buffer<ArrayBuffer>, headers: Record<string, string> = { 'content-type': 'application/json' }) {
  return fetch(`${server.baseURL}/images/generations`, { method: 'POST', headers: { ...auth, ...headers }, body });
}

async function expectError(res: Response, status: number, code: string | null, param: string | null = null) {
  expect(res.status).toBe(status);
  expect(res.headers.get('content-type')).toMatch(/^application\/json/);
  expect(res.headers.get('x-request-id')).toMatch(/^req_[0-9a-f]{32}$/);
  const body = await res.json();
  expect(Object.keys(body.error).sort()).toEqual(['code', 'message', 'param', 'type']);
  expect(body.error).toMatchObject({ type: 'invalid_request_error', param, code });
  expect(body.error.message).toEqual(expect.any(String));
  return body.error as { message: string };
}

describe('malformed requests', () => {
  it('malformed JSON -> 400', async () => {
    const error = await expectError(await post('{"model": "stub",'), 400, null);
    expect(error.message).toMatch(/could not parse the JSON body/);
  });

  it('empty JSON body -> 400', async () => {
    await expectError(await post(''), 400, null);
  });

  it('a JSON value that is not an object -> 400 invalid_type', async () => {
    for (const body of ['[]', '"a red circle"', '42', 'null']) await expectError(await post(body), 400, 'invalid_type');
  });

  it('a __proto__ or constructor.prototype key -> 400 saying so, never a polluted object', async () => {
    for (const body of ['{"model":"stub","prompt":"x","__proto__":{"n":5}}', '{"model":"stub","prompt":"x","constructor":{"prototype":{"n":5}}}']) {
      const error = await expectError(await post(body), 400, null);
      expect(error.message).toMatch(/or had a '__proto__' or 'constructor' key/);
    }
  });

  it('wrong content type -> 415', async () => {
    const error = await expectError(await post('model=stub&prompt=x', { 'content-type': 'application/x-www-form-urlencoded' }), 415, 'unsupported_media_type');
    expect(error.message).toContain('application/x-www-form-urlencoded');
  });

  it('JSON with a UTF-8 charset parameter is fine; another charset -> 415, not a body read as if it were UTF-8', async () => {
    const json = JSON.stringify({ model: 'stub', prompt: 'x' });
    for (const type of ['application/json; charset=utf-8', 'application/json;charset="UTF-8"', 'application/json; charset=us-ascii']) {
      expect((await post(json, { 'content-type': type })).status, type).toBe(200);
    }
    const error = await expectError(await post(Buffer.from(json, 'utf16le'), { 'content-type': 'application/json; charset=utf-16' }), 415, 'unsupported_media_type');
    expect(error.message).toContain("charset 'utf-16'");
  });

  it('bytes that are no UTF-8 -> 400 invalid_encoding, not a prompt with U+FFFD drawn in it; a BOM and non-ASCII text are fine', async () => {
    const wrapped = (bytes: number[]) => Buffer.concat([Buffer.from('{"model":"stub","prompt":"a '), Buffer.from(bytes), Buffer.from('"}')]);
    // Latin-1 'é', a lone continuation byte, and the UTF-16 byte-order mark.
    for (const bytes of [[0xe9], [0x80], [0xff, 0xfe]]) {
      const error = await expectError(await post(wrapped(bytes)), 400, 'invalid_encoding');
      expect(error.message).toMatch(/not valid UTF-8/);
    }
    expect((await post(wrapped([...Buffer.from('café 🎨')]))).status).toBe(200);
    expect((await post(Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from('{"model":"stub","prompt":"x"}')]))).status).toBe(200);
  });

  it('a number too large for a double says so (JSON reads 1e309 as infinity)', async () => {
    const error = await expectError(await post('{"model":"stub","prompt":"x","n":1e309}'), 400, 'invalid_type', 'n');
    expect(error.message).toBe("Invalid type for 'n': expected an integer, but got a number too large to represent instead.");
  });

  it('body over the limit -> 413 request_too_large', async () => {
    const huge = JSON.stringify({ model: 'stub', prompt: 'x'.repeat(2 * 1024 * 1024) });
    await expectError(await post(huge), 413, 'request_too_large');
  });
});

describe('routing', () => {
  it('unknown route -> 404 like OpenAI, even without a key', async () => {
    const res = await fetch(`${server.baseURL}/images/variations/nope`);
    const error = await expectError(res, 404, null);
    expect(error.message).toBe('Invalid URL (GET /v1/images/variations/nope)');
  });

  it('a path the API has under /v1, asked for without it (a base URL set without /v1) -> 404 that says where the API is', async () => {
    const origin = server.baseURL.replace(/\/v1$/, '');
    const client = new OpenAI({ baseURL: origin, apiKey: TEST_KEY, maxRetries: 0 });
    const refused = await client.images.generate({ model: 'stub', prompt: 'x' }).catch((err: unknown) => err);
    expect(refused).toBeInstanceOf(OpenAI.NotFoundError);
    expect((refused as InstanceType<typeof OpenAI.NotFoundError>).error).toEqual({
      message: `Invalid URL (POST /images/generations): this server's API is under /v1 (POST /v1/images/generations). Set the client's base URL with /v1 at its end, e.g. ${origin}/v1.`,
      type: 'invalid_request_error',
      param: null,
      code: null,
    });
    // Only where the API has that method at that path: other misses keep OpenAI's words.
    expect((await expectError(await fetch(`${origin}/images/generations`), 404, null)).message).toBe('Invalid URL (GET /images/generations)');
    expect((await expectError(await fetch(`${origin}/images/nope`, { method: 'POST' }), 404, null)).message).toBe('Invalid URL (POST /images/nope)');
  });

  it('a base URL set with a trailing slash (/v1//images/generations) reaches the route, its key checked as ever', async () => {
    const twice = `${server.baseURL}//images//generations`;
    const body = JSON.stringify({ model: 'stub', prompt: 'x', response_format: 'b64_json' });
    const res = await fetch(twice, { method: 'POST', headers: { ...auth, 'content-type': 'application/json' }, body });
    expect(res.status).toBe(200);
    expect((await res.json()).data).toHaveLength(1);
    await expectError(await fetch(twice, { method: 'POST', headers: { 'content-type': 'application/json' }, body }), 401, null);
    expect((await fetch(`${server.baseURL}//models`, { headers: auth })).status).toBe(200);
  });

  it('/v1/models/ with no id -> 404 Invalid URL, not a model named ""', async () => {
    const error = await expectError(await fetch(`${server.baseURL}/models/?x=1`, { headers: auth }), 404, null);
    expect(error.message).toBe('Invalid URL (GET /v1/models/)');
  });

  it('wrong method -> 405 with Allow', async () => {
    const res = await fetch(`${server.baseURL}/images/generations`, { headers: auth });
    expect(res.headers.get('allow')).toBe('POST');
    await expectError(res, 405, 'method_not_allowed');
    const models = await fetch(`${server.baseURL}/models/stub`, { method: 'DELETE', headers: auth });
    expect(models.headers.get('allow')).toBe('GET, HEAD');
    await expectError(models, 405, 'method_not_allowed');
  });
});

describe('request ids', () => {
  it('echoes a client x-request-id and otherwise makes a req_ id', async () => {
    const echoed = await fetch(`${server.origin}/health`, { headers: { 'x-request-id': 'client-trace-42' } });
    expect(echoed.headers.get('x-request-id')).toBe('client-trace-42');
    const generated = await fetch(`${server.origin}/health`);
    expect(generated.headers.get('x-request-id')).toMatch(/^req_[0-9a-f]{32}$/);
    expect(generated.headers.get('openai-processing-ms')).toMatch(/^\d+$/);
  });

  it('replaces an unreasonable client id', async () => {
    const res = await fetch(`${server.origin}/health`, { headers: { 'x-request-id': 'x'.repeat(500) } });
    expect(res.headers.get('x-request-id')).toMatch(/^req_[0-9a-f]{32}$/);
  });

  it('puts the id on error responses too', async () => {
    const res = await post('{', { 'content-type': 'application/json', 'x-request-id': 'trace-7' });
    expect(res.headers.get('x-request-id')).toBe('trace-7');
  });
});

describe('forms (edits and variations)', () => {
  const picture = () => sharp({ create: { width: 64, height: 64, channels: 3, background: 'red' } }).png().toBuffer();
  const postForm = (route: string, body: FormData | Buffer<ArrayBuffer>, headers: Record<string, string> = {}) =>
    fetch(`${server.baseURL}/images/${route}`, { method: 'POST', headers: { ...auth, ...headers }, body });

  /** A form whose prompt part carries `prompt` as raw bytes (what FormData, which writes UTF-8, cannot send), of Content-Type `type` if given. */
  async function formWithPrompt(prompt: Buffer, type?: string): Promise<[Buffer<ArrayBuffer>, Record<string, string>]> {
    const boundary = 'http-test-boundary';
    const part = (headers: string, content: Buffer) => Buffer.concat([Buffer.from(`--${boundary}\r\n${headers}\r\n\r\n`), content, Buffer.from('\r\n')]);
    const body = Buffer.concat([
      part('Content-Disposition: form-data; name="model"', Buffer.from('stub')),
      part('Content-Disposition: form-data; name="response_format"', Buffer.from('b64_json')),
      part(`Content-Disposition: form-data; name="prompt"${type ? `\r\nContent-Type: ${type}` : ''}`, prompt),
      part('Content-Disposition: form-data; name="image"; filename="in.png"\r\nContent-Type: image/png', await picture()),
      Buffer.from(`--${boundary}--\r\n`),
    ]);
    return [body, { 'content-type': `multipart/form-data; boundary=${boundary}` }];
  }

  it('a text field sent as a file (curl -F prompt=@prompt.txt) -> 400 invalid_type naming it, not an unknown parameter', async () => {
    const edit = new FormData();
    edit.set('image', new Blob([await picture()], { type: 'image/png' }), 'in.png');
    edit.set('prompt', new Blob(['a blue square'], { type: 'text/plain' }), 'prompt.txt');
    const error = await expectError(await postForm('edits', edit), 400, 'invalid_type', 'prompt');
    expect(error.message).toMatch(/^Invalid type for 'prompt': expected a text field, but got a file upload instead\./);
    const variation = new FormData();
    variation.set('image', new Blob([await picture()], { type: 'image/png' }), 'in.png');
    variation.set('n', new Blob(['2']), 'n.txt');
    await expectError(await postForm('variations', variation), 400, 'invalid_type', 'n');
    // A file of a name the endpoint takes in no form is still an unknown parameter.
    edit.delete('prompt');
    edit.set('foo', new Blob(['x']), 'foo.txt');
    await expectError(await postForm('edits', edit), 400, 'unknown_parameter', 'foo');
  });

  it('form text that is no UTF-8 -> 400 invalid_encoding, not a prompt with U+FFFD drawn in it; UTF-8 text is taken', async () => {
    // Latin-1 'é', as curl on Windows sends -F 'prompt=café' from a console in code page 1252.
    const error = await expectError(await postForm('edits', ...(await formWithPrompt(Buffer.from('a caf\xe9 sign', 'latin1')))), 400, 'invalid_encoding', 'prompt');
    expect(error.message).toMatch(/^The form field 'prompt' is not valid UTF-8/);
    expect((await postForm('edits', ...(await formWithPrompt(Buffer.from('a café sign 🎨'))))).status).toBe(200);
    // A part that names its charset is read in it.
    expect((await postForm('edits', ...(await formWithPrompt(Buffer.from('a caf\xe9 sign', 'latin1'), 'text/plain; charset=iso-8859-1')))).status).toBe(200);
  });

  it('form text in a named charset the parser cannot read (windows-1251) -> 400 invalid_encoding that names the charsets it reads, not advice to name one', async () => {
    // 'кот' in windows-1251, the part saying so: the form parser (busboy) reads only UTF-8, Latin-1 and
    // UTF-16LE by their names and every other charset as UTF-8, so naming this one cannot help.
    const error = await expectError(await postForm('edits', ...(await formWithPrompt(Buffer.from([0xea, 0xee, 0xf2]), 'text/plain; charset=windows-1251'))), 400, 'invalid_encoding', 'prompt');
    expect(error.message).toMatch(/^The form field 'prompt' is not valid UTF-8/);
    expect(error.message).toContain('ISO-8859-1');
    expect(error.message).not.toMatch(/or name the part's charset in its Content-Type;/);
  });

  it('a Content-Type set by hand, without the boundary the body uses -> 400 invalid_multipart saying to let the client set it, not the parser\'s "Unexpected end"', async () => {
    const [body] = await formWithPrompt(Buffer.from('a blue square'));
    // Python's requests with files= and headers={'Content-Type': 'multipart/form-data'}, or fetch with FormData and that header.
    const none = await expectError(await postForm('edits', body, { 'content-type': 'multipart/form-data' }), 400, 'invalid_multipart');
    expect(none.message).toMatch(/^The Content-Type multipart\/form-data names no boundary=.*Let the HTTP client set the Content-Type of a form/);
    // A boundary the body does not use (a header copied from another request), or none at all after boundary=.
    for (const type of ['multipart/form-data; boundary=copied-from-elsewhere', 'multipart/form-data; boundary=']) {
      const other = await expectError(await postForm('variations', body, { 'content-type': type }), 400, 'invalid_multipart');
      expect(other.message).toMatch(/^The multipart\/form-data body has no part that begins with the boundary its Content-Type names.*Let the HTTP client set the Content-Type of a form/);
    }
    // The right boundary but a body cut short before its closing one still says that.
    const cut = body.subarray(0, body.lastIndexOf('--http-test-boundary--'));
    const short = await expectError(await postForm('edits', cut, { 'content-type': 'multipart/form-data; boundary=http-test-boundary' }), 400, 'invalid_multipart');
    expect(short.message).toMatch(/^The multipart\/form-data body could not be read: .*unexpected end/i);
  });

  it('a boundary= longer than the parser takes -> 400 invalid_multipart naming RFC 2046\'s 70 characters, not the parser\'s "needle" words', async () => {
    const boundary = 'b'.repeat(300);
    const body = Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="prompt"\r\n\r\nx\r\n--${boundary}--\r\n`);
    const error = await expectError(await postForm('edits', body, { 'content-type': `multipart/form-data; boundary=${boundary}` }), 400, 'invalid_multipart');
    expect(error.message).toMatch(/^The boundary= of the Content-Type multipart\/form-data is too long: RFC 2046 allows at most 70 characters\. Let the HTTP client set/);
  });

  it('variations, another content type -> 415 saying they take only a multipart form (no JSON, which they refuse too)', async () => {
    for (const type of ['text/plain', 'application/x-www-form-urlencoded']) {
      const error = await expectError(await postForm('variations', Buffer.from('n=1'), { 'content-type': type }), 415, 'unsupported_media_type');
      expect(error.message).toContain("accepts only 'multipart/form-data'");
      expect(error.message).not.toContain('application/json');
    }
    // JSON, which Fastify parses for them as for edits, gets the same answer.
    const json = await expectError(await postForm('variations', Buffer.from('{"n":1}'), { 'content-type': 'application/json' }), 415, 'unsupported_media_type');
    expect(json.message).toContain("accepts only 'multipart/form-data'");
    // Edits take both.
    const edits = await expectError(await postForm('edits', Buffer.from('n=1'), { 'content-type': 'text/plain' }), 415, 'unsupported_media_type');
    expect(edits.message).toContain("'application/json' and 'multipart/form-data'");
  });
});
