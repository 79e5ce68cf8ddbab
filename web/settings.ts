import type { ApiErrorBody, Model } from './api.js';
import { ROUTE_FIELDS, type Fields, type ImageRequest, type Route } from './request.js';

/**
 * The settings form as request fields and back ("reuse settings"). An empty control means "the model's
 * default" and is not sent; the seed is sent only when fixed, since every answer names each image's seed.
 */

const NUMERIC = new Set(['n', 'steps', 'guidance_scale', 'seed', 'strength']);

/** A form element that holds a setting's value. */
export type Control = HTMLInputElement | HTMLSelectElement | HTMLTextAreaElement;

export const isControl = (element: unknown): element is Control =>
  element instanceof HTMLInputElement || element instanceof HTMLSelectElement || element instanceof HTMLTextAreaElement;

function control(form: HTMLFormElement, name: string): Control | null {
  const element = form.elements.namedItem(name);
  return isControl(element) ? element : null;
}

const seedFixed = (form: HTMLFormElement): boolean => (form.elements.namedItem('seed_mode') as RadioNodeList).value === 'fixed';

/** The fields of the form that `route` takes. */
export function readFields(form: HTMLFormElement, route: Route): Fields {
  const fields: Fields = {};
  for (const name of ROUTE_FIELDS[route]) {
    if (name === 'seed' && !seedFixed(form)) continue;
    const value = control(form, name)?.value.trim() ?? '';
    if (value === '') continue;
    // Number inputs give '' (skipped above) or a number's text; JSON must carry numbers, not strings.
    fields[name] = NUMERIC.has(name) ? Number(value) : value;
  }
  return fields;
}

/**
 * What keeps the form from being sent as it shows, as an error of the field that says so: a number field
 * whose text is no number ("1e", "12-3": the browser's value is then empty, which readFields leaves out,
 * so the model's default ran instead of what the field showed), or the seed fixed with none given
 * (a random one ran). Undefined when the form says what it will send.
 */
export function unreadableField(form: HTMLFormElement, route: Route): ApiErrorBody | undefined {
  for (const name of ROUTE_FIELDS[route]) {
    const element = control(form, name);
    if (!(element instanceof HTMLInputElement) || (name === 'seed' && !seedFixed(form))) continue;
    if (element.validity.badInput) return { param: name, message: 'This is not a number: type it in digits (a fraction with a point, as 7.5), or leave the field empty for the model\'s default.' };
    if (name === 'seed' && element.value.trim() === '') return { param: name, message: 'Type the seed to fix, or choose random.' };
  }
  return undefined;
}

function setControl(element: Control, value: string | undefined): void {
  if (!(element instanceof HTMLSelectElement)) {
    element.value = value ?? element.defaultValue;
    return;
  }
  const options = [...element.options];
  if (value === undefined) {
    element.selectedIndex = Math.max(0, options.findIndex((o) => o.defaultSelected));
    return;
  }
  // A value the list lacks (a model since removed) is shown as it was, and the server names the problem.
  if (!options.some((o) => o.value === value)) element.add(new Option(value));
  element.value = value;
}

/**
 * Puts a request's fields back in the form (those of its route that it lacks back to their defaults), with
 * its seed fixed. The fields its route does not take stay as they are: a variation has no prompt, and
 * reusing its settings set the prompt being written to the page's "a red circle".
 */
export function applyFields(form: HTMLFormElement, { route, fields }: ImageRequest, seed: number, models: Model[]): void {
  for (const name of ROUTE_FIELDS[route]) {
    const element = control(form, name);
    if (!element || name === 'seed') continue;
    setControl(element, fields[name] === undefined ? undefined : String(fields[name]));
    // The size, quality and scheduler lists are the model's: filled for the model just set, before they are.
    if (name === 'model') showModelChoices(form, models);
  }
  (form.elements.namedItem('seed_mode') as RadioNodeList).value = 'fixed';
  control(form, 'seed')!.value = String(seed);
}

/**
 * Fills the model list, keeping the model chosen, else choosing the server's default (DEFAULT_MODEL): the
 * list is sorted by id, and its first was the embedded demo model wherever a real one sorts after it. The
 * sizes, qualities and schedulers follow the chosen model.
 */
export function showModels(form: HTMLFormElement, models: Model[]): void {
  const select = control(form, 'model') as HTMLSelectElement;
  const chosen = select.value;
  select.replaceChildren(...models.map((m) => new Option(m.id, m.id)));
  const kept = models.find((m) => m.id === chosen) ?? models.find((m) => m.default);
  if (kept) select.value = kept.id;
  showModelChoices(form, models);
}

/** The model chosen in the form. */
export function chosenModel(form: HTMLFormElement, models: readonly Model[]): Model | undefined {
  return models.find((m) => m.id === control(form, 'model')?.value);
}

/**
 * Offers only what the chosen model takes under its name, as /v1/models lists it: its sizes (at its
 * default size unless the one chosen is among them), and its qualities and schedulers after "model
 * default" (chosen unless the model takes the one chosen). One list of every value for all models
 * offered what the server then refused (standard and hd under a gpt-image name, FLUX's sampler for SD).
 */
export function showModelChoices(form: HTMLFormElement, models: Model[]): void {
  const model = chosenModel(form, models);
  offer(control(form, 'size') as HTMLSelectElement, model?.sizes ?? [], model?.default_size ?? '');
  for (const [name, values] of [
    ['quality', model?.qualities],
    ['scheduler', model?.schedulers],
  ] as const) {
    const select = control(form, name) as HTMLSelectElement;
    offer(select, values ?? [], '', [...select.options].filter((o) => o.value === ''));
  }
}

/** Fills `select` with `values` after the options `kept`, keeping its choice where `values` has it, else choosing `fallback`. */
function offer(select: HTMLSelectElement, values: readonly string[], fallback: string, kept: HTMLOptionElement[] = []): void {
  const chosen = select.value;
  select.replaceChildren(...kept, ...values.map((value) => new Option(value, value)));
  select.value = values.includes(chosen) ? chosen : fallback;
}
