import type { ApiFailure } from './api.js';

/**
 * API errors shown as words beside the field they name (`param`), the field marked invalid and
 * focused, so a screen reader says what is wrong where; an error that names no field of the form
 * goes to the form's own message line.
 */

/** `images[0].image_url` and `image[1]` are the form's `image`; other params are the fields' names. */
function fieldName(param: string): string {
  return /^images?\b/.test(param) ? 'image' : param.split(/[.[]/)[0];
}

/** Clears the message of one field (`image` once a picture could be read after all). */
export function clearError(form: HTMLFormElement, name: string): void {
  const message = form.querySelector<HTMLElement>(`#${CSS.escape(name)}-error`);
  if (message) message.textContent = '';
  form.querySelector(`#${CSS.escape(name)}`)?.removeAttribute('aria-invalid');
}

export function clearErrors(form: HTMLFormElement): void {
  for (const message of form.querySelectorAll<HTMLElement>('.error')) message.textContent = '';
  for (const field of form.querySelectorAll('[aria-invalid]')) field.removeAttribute('aria-invalid');
}

export function showError(form: HTMLFormElement, failure: ApiFailure): void {
  clearErrors(form);
  const name = failure.error.param ? fieldName(failure.error.param) : undefined;
  const field = name ? form.querySelector<HTMLElement>(`#${CSS.escape(name)}`) : null;
  const message = field && form.querySelector<HTMLElement>(`#${CSS.escape(name!)}-error`);
  if (!field || !message) {
    form.querySelector<HTMLElement>('#form-error')!.textContent = failure.message;
    return;
  }
  message.textContent = failure.message;
  field.setAttribute('aria-invalid', 'true');
  field.focus();
}
