import { ApiFailure, apiKey, listModels, unsendableKey, type Model } from './api.js';
import { showCode } from './code-dialog.js';
import { keepSettings, restoreSettings } from './kept-settings.js';
import { clearError, clearErrors, showError } from './field-errors.js';
import { MaskPainter } from './mask.js';
import { PictureSize } from './picture-size.js';
import { imageFileName, requestForImage, streams, type ImageRequest, type Route } from './request.js';
import { historyLine, resultCard, timeLeft, type Result } from './results.js';
import { runRequest, type FinishedImage } from './run.js';
import { applyFields, chosenModel, readFields, showModelChoices, showModels, unreadableField } from './settings.js';
import { snippetsOf } from './snippets.js';
import { StatusLine } from './status-line.js';

/**
 * The playground: the settings form, the run (progress, previews, Cancel), the results and the tab's
 * history, the edit panel; each part lives in its own module, this one wires them to the page.
 */

const byId = <T extends HTMLElement>(id: string): T => document.getElementById(id) as T;

const form = byId<HTMLFormElement>('settings');
const status = new StatusLine(byId('status'));
const progress = byId<HTMLProgressElement>('progress');
const previews = byId<HTMLDivElement>('previews');
const resultsList = byId<HTMLUListElement>('results');
const historyList = byId<HTMLUListElement>('history');
const keyDialog = byId<HTMLDialogElement>('key-dialog');
const keyInput = byId<HTMLInputElement>('key');
const buttons = { generate: byId<HTMLButtonElement>('generate'), edit: byId<HTMLButtonElement>('edit-run'), variations: byId<HTMLButtonElement>('variations-run'), cancel: byId<HTMLButtonElement>('cancel') };
/** The button that sends each route's request. */
const SENDS: Record<Route, HTMLButtonElement> = { generations: buttons.generate, edits: buttons.edit, variations: buttons.variations };
const painter = new MaskPainter(byId('mask'), byId('source'), byId('brush'), byId('erase'), byId('mask-cursor'));
const pictureSize = new PictureSize(byId('size'), byId('size-help'), [...document.querySelectorAll<HTMLElement>('.crop-cut')]);

let models: Model[] = [];
/** The picture in the edit panel. */
let editSource: Blob | undefined;
/** The request in flight: aborting it closes the connection, and the server cancels the work. */
let running: AbortController | undefined;
/** Every image of this tab, with the history line that shows its URL's time left. */
const history: { result: Result; expiry: HTMLElement }[] = [];

/**
 * What the key dialog says of a 401: the key refused, with the server's words; nothing when the tab has
 * no key yet (the dialog's "needs an API key" says it all), rather than "refused this key" of none.
 */
const keyProblem = (err: ApiFailure): string => (apiKey.get() ? `The server refused this key: ${err.message}` : '');

/** Loads the models; a 401 means the server has keys and this tab has none, or a wrong one. */
async function connect(): Promise<void> {
  try {
    models = await listModels();
  } catch (err) {
    if (err instanceof ApiFailure && err.isKeyProblem) return askKey(keyProblem(err));
    if (err instanceof ApiFailure) return void (byId('form-error').textContent = `The model list could not be loaded: ${err.message}`);
    throw err;
  }
  showModels(form, models);
  restoreSettings(form, models);
  byId('key-state').textContent = apiKey.get() ? 'Using the API key of this tab.' : 'This server needs no API key.';
  byId('key-open').hidden = !apiKey.get();
  keyDialog.close();
}

/**
 * Opens the key dialog saying `problem`. `returnTo` gets the focus when it closes: the dialog gives it
 * back to what had it when it opened, which for a key refused in a request's answer was Cancel, disabled
 * since, and the focus fell to the top of the page; the button that sent the request sends it again.
 */
function askKey(problem: string, returnTo?: HTMLElement): void {
  if (returnTo && !keyDialog.open) keyDialog.addEventListener('close', () => returnTo.focus(), { once: true });
  byId('key-error').textContent = problem;
  byId('key-state').textContent = problem ? 'The API key was refused.' : 'This server needs an API key.';
  byId('key-open').hidden = false;
  keyInput.value = apiKey.get();
  byId('key-forget').hidden = !apiKey.get();
  if (problem) keyInput.setAttribute('aria-invalid', 'true');
  else keyInput.removeAttribute('aria-invalid');
  if (!keyDialog.open) keyDialog.showModal();
  keyInput.focus();
}

byId('key-form').addEventListener('submit', (event) => {
  event.preventDefault();
  // Refused here, the typed key kept to be mended: the browser cannot send it, so no server can say so.
  const problem = unsendableKey(keyInput.value);
  if (problem) {
    byId('key-error').textContent = problem;
    keyInput.setAttribute('aria-invalid', 'true');
    return keyInput.focus();
  }
  apiKey.set(keyInput.value);
  void connect();
});
byId('key-open').addEventListener('click', () => askKey(''));
// The dialog's key field is required, so no key can be cleared by saving it empty: this is the way.
byId('key-forget').addEventListener('click', () => {
  apiKey.clear();
  void connect();
});

function setBusy(busy: boolean): void {
  buttons.generate.disabled = busy;
  buttons.edit.disabled = buttons.variations.disabled = busy || !editSource;
  buttons.cancel.disabled = !busy;
  progress.hidden = true;
  if (busy) buttons.cancel.focus();
}

/**
 * When an image's URL dies: an S3 presigned URL (S3_PRESIGNED_URLS) says so in its query, signed for GET
 * only; the server's files route sends the time left in Cache-Control.
 */
/**
 * Where this page reads an image URL the server answered: a URL of the server's own files route through
 * this page's origin, whatever origin PUBLIC_BASE_URL gave it (the route is the same server's, or
 * another replica's over the same store), since a script may read another origin's answer only where
 * it sends CORS headers, which the files route does only with CORS_ORIGINS; any other (an S3 bucket's
 * presigned URL) as it is.
 */
function readableUrl(url: string): string {
  const parsed = new URL(url, location.href);
  return /^\/v1\/images\/files\/[^/]+$/.test(parsed.pathname) ? new URL(parsed.pathname, location.href).href : parsed.href;
}

async function expiryOf(url: string): Promise<number | undefined> {
  const query = new URL(url, location.href).searchParams;
  const signed = /^(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z$/.exec(query.get('X-Amz-Date') ?? '');
  if (signed && query.has('X-Amz-Expires')) {
    const [year, month, day, hours, minutes, seconds] = signed.slice(1).map(Number);
    return Date.UTC(year, month - 1, day, hours, minutes, seconds) + Number(query.get('X-Amz-Expires')) * 1000;
  }
  const res = await fetch(readableUrl(url), { method: 'HEAD' }).catch(() => undefined);
  const seconds = /max-age=(\d+)/.exec(res?.headers.get('cache-control') ?? '')?.[1];
  return seconds === undefined ? undefined : Date.now() + Number(seconds) * 1000;
}

function showExpiry(): void {
  const now = Date.now();
  for (const { result, expiry } of history) {
    expiry.textContent = result.url ? (result.expiresAt ? timeLeft(result.expiresAt, now) : '') : `${streams(result.request.route) ? 'streamed' : 'inline'}: kept in this tab only`;
  }
}
setInterval(showExpiry, 30_000);

async function addResult(request: ImageRequest, image: FinishedImage, ms: number): Promise<void> {
  // The size the answer says it was made at: a request's `auto` is shown as the size it meant.
  const result: Result = { request, ...image, model: String(request.fields.model), size: image.size ?? String(request.fields.size), ms };
  resultsList.append(resultCard(result, actions));
  const line = historyLine(result);
  historyList.prepend(line);
  history.push({ result, expiry: line.querySelector('.expiry')! });
  if (result.url) result.expiresAt = await expiryOf(result.url);
  showExpiry();
}

async function send(route: Route): Promise<void> {
  if (running) return;
  clearErrors(form);
  const unreadable = unreadableField(form, route);
  if (unreadable) return showError(form, new ApiFailure(0, unreadable));
  const request: ImageRequest = { route, fields: readFields(form, route) };
  if (route !== 'generations') {
    if (!editSource) return showError(form, new ApiFailure(0, { message: 'Choose an image to edit first (or take one from the results).', param: 'image' }));
    request.image = editSource;
    if (route === 'edits') {
      try {
        request.mask = await painter.toBlob();
      } catch (err) {
        return showError(form, new ApiFailure(0, { message: `The painted mask could not be encoded (${(err as Error).message}): clear it and paint again.`, param: 'image' }));
      }
    }
  }
  const delivery = { stream: byId<HTMLSelectElement>('delivery').value === 'stream', partialImages: Number(byId<HTMLSelectElement>('partial_images').value) };
  running = new AbortController();
  setBusy(true);
  status.say('Sending…');
  const started = performance.now();
  let count = 0;
  let done = false;
  try {
    await runRequest(request, delivery, running.signal, {
      queued: (ahead) => status.say(ahead === 0 ? 'Queued: next for a worker.' : `Queued: ${ahead} batch${ahead === 1 ? '' : 'es'} ahead.`),
      step: (step, steps) => {
        status.step(step, steps);
        Object.assign(progress, { hidden: false, max: steps, value: step });
      },
      partial: (src) => {
        const preview = Object.assign(document.createElement('img'), { src, alt: `Preview of the picture forming (${previews.childElementCount + 1})` });
        previews.append(preview);
      },
      image: (image) => {
        // The grid shows the latest request's images; the earlier ones stay until the first new one comes.
        if (count++ === 0) resultsList.replaceChildren();
        void addResult(request, image, performance.now() - started);
      },
    });
    status.say(`Done: ${count} image${count === 1 ? '' : 's'} in ${((performance.now() - started) / 1000).toFixed(1)} s.`);
    done = true;
  } catch (err) {
    if ((err as Error).name === 'AbortError') status.say('Cancelled: the server stopped the work.');
    else if (err instanceof ApiFailure) {
      status.failed(err.message);
      if (err.isKeyProblem) askKey(keyProblem(err), SENDS[route]);
      else showError(form, err);
    } else throw err;
  } finally {
    running = undefined;
    // Each preview holds its picture in memory until its URL is revoked.
    for (const preview of previews.querySelectorAll('img')) URL.revokeObjectURL(preview.src);
    previews.replaceChildren();
    setBusy(false);
    // The focus was on Cancel, now disabled: to the new images when they came; else (a failure that names
    // no field, a cancel) back to the button that sent the request, so Enter sends it again, rather than
    // to an earlier request's image, which would pass for this one's.
    if (document.activeElement === buttons.cancel || document.activeElement === document.body) (done ? resultsList.querySelector('a') : SENDS[route])?.focus();
  }
}

/**
 * Puts a picture in the edit panel; true when it is there, and the status line says `loaded` and what
 * the size does for its shape. One that cannot be read (not an image, an expired URL) is reported
 * beside the image field, and the panel keeps the picture it had.
 */
async function setEditSource(take: () => Promise<Blob>, loaded = ''): Promise<boolean> {
  try {
    const image = await take();
    await painter.load(image);
    editSource = image;
  } catch (err) {
    const reason = err instanceof ApiFailure ? err.message : 'it is not a picture this browser can read (PNG, JPEG or WebP)';
    showError(form, new ApiFailure(0, { message: `That image cannot be edited: ${reason}.`, param: 'image' }));
    return false;
  }
  clearError(form, 'image');
  byId('canvas-box').hidden = false;
  const shape = pictureSize.fit(chosenModel(form, models), painter.extent);
  if (loaded || shape) status.say(`${loaded}${loaded && shape && ' '}${shape}`);
  buttons.edit.disabled = buttons.variations.disabled = Boolean(running);
  return true;
}

/**
 * A result's picture; one that cannot be read is an ApiFailure saying why: gone (expired, or the server
 * restarted without its store), or on another origin that does not let this page read it.
 */
async function fromResult(result: Result): Promise<Blob> {
  const src = readableUrl(result.src);
  const res = await fetch(src).catch(() => undefined);
  if (!res) {
    const { origin } = new URL(src);
    const why = origin === location.origin ? 'the server could not be reached' : `${origin} could not be reached, or does not let this page read its images (a bucket's presigned URLs need a CORS rule allowing ${location.origin}: see docs/playground.md)`;
    throw new ApiFailure(0, { message: `it could not be read: ${why}` });
  }
  if (!res.ok) throw new ApiFailure(res.status, { message: `the server no longer has it (HTTP ${res.status}): its URL may have expired` });
  return res.blob();
}

const actions = {
  reuse(result: Result): void {
    applyFields(form, result.request, result.seed, models);
    const cut = pictureSize.show(chosenModel(form, models));
    status.say(`The settings of seed ${result.seed} are back in the form.${cut && ` ${cut}`}`);
    byId('prompt').focus();
  },
  async edit(result: Result): Promise<void> {
    if (!(await setEditSource(() => fromResult(result), 'The image is in the edit panel: paint a mask, change the prompt, then Edit image.'))) return;
    // Painting comes next: the focus on the picture brings it into view (the prompt's focus would scroll
    // back up, past it) and lets the arrow keys and Space paint at once.
    byId('mask').focus();
  },
  async variations(result: Result): Promise<void> {
    if (await setEditSource(() => fromResult(result))) await send('variations');
  },
  code(result: Result): void {
    const { image, mask } = result.request;
    const files = [image && { name: imageFileName(image), blob: image }, mask && { name: 'mask.png', blob: mask }].filter((file) => file !== undefined);
    const save = files.length ? ` Save ${files.map((file) => file.name).join(' and ')} (below) beside it.` : '';
    showCode(byId('code-dialog'), snippetsOf(`${location.origin}/v1`, requestForImage(result.request, result.seed)), `This request makes this image again (seed ${result.seed}); the key comes from OPENAI_API_KEY.${save}`, files);
  },
};

form.addEventListener('submit', (event) => {
  event.preventDefault();
  void send('generations');
});
document.addEventListener('keydown', (event) => {
  // Not while a modal dialog (the key, the code) is open: the page behind it is inert, and a request
  // sent from there would run unseen.
  if (event.key === 'Enter' && (event.ctrlKey || event.metaKey) && !document.querySelector('dialog:modal')) {
    event.preventDefault();
    void send('generations');
  }
});
// Enter in the edit panel's Strength sends the edit it was set for: the form's own Enter clicks its first
// button, Generate, a text-to-image request that reads no strength and replaces the results. Ctrl+Enter
// still generates (the document's handler above).
byId('strength').addEventListener('keydown', (event) => {
  if (event.key !== 'Enter' || event.ctrlKey || event.metaKey) return;
  event.preventDefault();
  void send('edits');
});
buttons.edit.addEventListener('click', () => void send('edits'));
buttons.variations.addEventListener('click', () => void send('variations'));
buttons.cancel.addEventListener('click', () => running?.abort());
byId('model').addEventListener('change', () => {
  const size = byId<HTMLSelectElement>('size').value;
  showModelChoices(form, models);
  const said = pictureSize.modelChosen(chosenModel(form, models), size);
  if (said) status.say(said);
});
/** A size chosen: said when it crops the picture to edit. */
byId('size').addEventListener('change', () => {
  const cut = pictureSize.show(chosenModel(form, models));
  if (cut) status.say(cut);
});
byId('seed').addEventListener('input', () => ((form.elements.namedItem('seed_mode') as RadioNodeList).value = 'fixed'));
byId<HTMLInputElement>('image').addEventListener('change', (event) => {
  const file = (event.target as HTMLInputElement).files?.[0];
  if (file) void setEditSource(async () => file);
});
byId('mask-clear').addEventListener('click', () => painter.clear());
const drop = byId('edit');
drop.addEventListener('dragover', (event) => event.preventDefault());
drop.addEventListener('drop', (event) => {
  event.preventDefault();
  const file = event.dataTransfer?.files[0];
  if (file) void setEditSource(async () => file);
});

// The settings outlive a reload of the tab (kept-settings.ts): kept whenever the page is hidden or left.
restoreSettings(form, models);
addEventListener('pagehide', () => keepSettings(form));
document.addEventListener('visibilitychange', () => {
  if (document.visibilityState === 'hidden') keepSettings(form);
});
// A reload or a closed tab drops the request running (the server stops its work): the browser asks first.
addEventListener('beforeunload', (event) => {
  if (running) event.preventDefault();
});

void connect();
