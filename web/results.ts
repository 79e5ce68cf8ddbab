import { extensionOf, type ImageRequest } from './request.js';

/**
 * The images of this tab: one record each, shown as a card in the results grid (the latest request's)
 * and as a line in the history (all of them, with the time left before the server's URL expires).
 */

export interface Result {
  /** The request that made it, as sent (without the streaming fields). */
  request: ImageRequest;
  seed: number;
  src: string;
  url?: string;
  /** When the server's URL stops working (unix ms), read from its Cache-Control. */
  expiresAt?: number;
  model: string;
  size: string;
  /** From sending the request to this image's arrival. */
  ms: number;
  index: number;
}

export interface ResultActions {
  reuse(result: Result): void;
  edit(result: Result): void;
  variations(result: Result): void;
  code(result: Result): void;
}

function element<K extends keyof HTMLElementTagNameMap>(tag: K, props: Partial<HTMLElementTagNameMap[K]> = {}, ...children: (Node | string)[]): HTMLElementTagNameMap[K] {
  const node = Object.assign(document.createElement(tag), props);
  node.append(...children);
  return node;
}

/**
 * A result's button, named for screen readers with the image it acts on. The name holds the words on the
 * button as they read (WCAG 2.5.3, label in name): a speech-control user says what they see ("click Copy
 * as code"), which "Copy image 1, seed 7 as code" did not answer to.
 */
function button(text: string, label: string, onClick: () => void): HTMLButtonElement {
  const node = element('button', { type: 'button', textContent: text });
  node.setAttribute('aria-label', label);
  node.addEventListener('click', onClick);
  return node;
}

/**
 * How much of a prompt the alt text and the history line show: prompts run to 32000 characters, which a
 * screen reader would read whole for every image and which would fill the history with one request.
 */
const SHOWN_PROMPT = 200;

/** What the picture is, for screen readers: the prompt it was asked for (its start, when long), or what it varies. */
function describe({ request, seed }: Result): string {
  const prompt = String(request.fields.prompt);
  const what = request.route === 'variations' ? 'a variation of the input image' : prompt.length > SHOWN_PROMPT ? `${prompt.slice(0, SHOWN_PROMPT)}…` : prompt;
  return `${request.route === 'edits' ? 'Edit: ' : ''}${what} (seed ${seed})`;
}

export function resultCard(result: Result, actions: ResultActions): HTMLLIElement {
  const name = `image ${result.index + 1}, seed ${result.seed}`;
  const file = `imagegen-${result.seed}.${extensionOf(result.request.fields)}`;
  const picture = element('img', { src: result.src, alt: describe(result), className: 'result-image' });
  picture.dataset.seed = String(result.seed);
  const caption = element('figcaption', {}, `seed ${result.seed} · ${result.size} · ${result.model} · ${(result.ms / 1000).toFixed(1)} s`);
  const open = element('a', { href: result.src, target: '_blank', rel: 'noopener', textContent: 'Open' });
  open.setAttribute('aria-label', `Open ${name} full size`);
  const download = element('a', { href: result.src, download: file, textContent: 'Download' });
  download.setAttribute('aria-label', `Download ${name}`);
  return element(
    'li',
    { className: 'result' },
    element('figure', {}, picture, caption),
    element(
      'div',
      { className: 'row' },
      open,
      download,
      button('Reuse settings', `Reuse settings of ${name}`, () => actions.reuse(result)),
      button('Edit', `Edit ${name}`, () => actions.edit(result)),
      button('Variations', `Variations of ${name}`, () => actions.variations(result)),
      button('Copy as code', `Copy as code: ${name}`, () => actions.code(result)),
    ),
  );
}

/** "23 h 59 min", "4 min", "expired". */
export function timeLeft(expiresAt: number, now: number): string {
  const minutes = Math.floor((expiresAt - now) / 60_000);
  if (expiresAt <= now) return 'URL expired';
  if (minutes < 1) return 'URL expires in under a minute';
  return `URL expires in ${minutes >= 60 ? `${Math.floor(minutes / 60)} h ` : ''}${minutes % 60} min`;
}

export function historyLine(result: Result): HTMLLIElement {
  return element(
    'li',
    {},
    // The line's text says what the thumbnail shows: an alt text would have it read twice.
    element('img', { src: result.src, alt: '', className: 'thumb' }),
    element('span', {}, `${new Date().toLocaleTimeString()} · ${describe(result)} · ${result.size} · ${result.model} `),
    element('span', { className: 'expiry' }),
  );
}
