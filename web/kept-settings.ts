import type { Model } from './api.js';
import { isControl, showModelChoices, type Control } from './settings.js';

/**
 * The settings form kept for the tab, in sessionStorage beside the key: a reload (F5, or a phone's
 * browser that discarded the tab while another app was in front) brought the page back with its
 * defaults, the prompt being written and every setting lost. Saved when the page is hidden or left,
 * which comes before either; brought back at start, the model and its lists (sizes, qualities,
 * schedulers) once the models are listed and those lists filled. The results are not kept: streamed
 * pictures live in the page alone.
 */

const SETTINGS_ITEM = 'imagegen.settings';

/**
 * The form's controls by the name a request gives them (their id where they have none); not the file
 * chooser (no page may set it) nor Erase, a brush's mode that would surprise on a new picture.
 */
function controls(form: HTMLFormElement): [string, Control][] {
  return [...form.elements].flatMap((element) => {
    const control = isControl(element) && !(element instanceof HTMLInputElement && (element.type === 'file' || element.type === 'checkbox')) ? element : undefined;
    const key = control && (control.name || control.id);
    return control && key ? [[key, control] as [string, Control]] : [];
  });
}

/** The values kept and not yet shown: those of lists not filled yet (the model's), until the models are listed. */
let unplaced: Map<string, string> | undefined;

function kept(): Map<string, string> {
  try {
    const values: unknown = JSON.parse(sessionStorage.getItem(SETTINGS_ITEM) ?? '{}');
    return new Map(Object.entries(values ?? {}).filter((entry): entry is [string, string] => typeof entry[1] === 'string'));
  } catch {
    // Not the page's JSON (written by hand, or by another page of this origin): nothing to bring back.
    return new Map();
  }
}

export function keepSettings(form: HTMLFormElement): void {
  const values: Record<string, string> = {};
  for (const [key, control] of controls(form)) {
    if (control instanceof HTMLInputElement && control.type === 'radio') {
      if (control.checked) values[key] = control.value;
    } else values[key] = control.value;
  }
  // Those still waiting for their list (the models could not be listed yet) stay as they were kept.
  sessionStorage.setItem(SETTINGS_ITEM, JSON.stringify({ ...values, ...Object.fromEntries(unplaced ?? []) }));
}

/** Shows `value` in `control`; false when it cannot (a list without that value, not yet or no longer; a radio button of another value). */
function place(control: Control, value: string): boolean {
  if (control instanceof HTMLSelectElement && ![...control.options].some((option) => option.value === value)) return false;
  if (control instanceof HTMLInputElement && control.type === 'radio') {
    if (control.value !== value) return false;
    control.checked = true;
  } else control.value = value;
  return true;
}

/**
 * Brings back what the form can show of the kept settings; with `models` listed, the model (its lists
 * filled for it) and its sizes, qualities and schedulers too, and what is still missing then (a model
 * since removed) is dropped. In the order of the form, where the model comes before its lists.
 */
export function restoreSettings(form: HTMLFormElement, models: Model[]): void {
  unplaced ??= kept();
  for (const [key, control] of controls(form)) {
    const value = unplaced.get(key);
    if (value === undefined || !place(control, value)) continue;
    unplaced.delete(key);
    if (key === 'model') showModelChoices(form, models);
  }
  if (models.length > 0) unplaced.clear();
}
