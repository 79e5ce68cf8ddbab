/**
 * The status line under Progress: what the request is doing, for the eye and, as a live region
 * (role=status), for screen readers, which read out each change of its text.
 */

/**
 * How often a screen reader hears the step count while the steps run. Each step read out, several a
 * second on a GPU, queued "Step 7 of 50" after "Step 6 of 50" for as long again as the steps took, and
 * the user heard "Done" last, long after it was.
 */
const SPOKEN_EVERY_MS = 5000;

export class StatusLine {
  /** While the steps run: the count shown at each step (hidden from screen readers), and the one last read out, with when. */
  private steps: { shown: HTMLElement; spoken: HTMLElement; at: number } | undefined;

  constructor(private readonly line: HTMLElement) {}

  /** Shows `text`, read out. */
  say(text: string): void {
    this.steps = undefined;
    this.line.replaceChildren(text);
  }

  /**
   * A failure, where the eye looks while a request runs. Its message is also shown, and announced, where
   * it belongs (beside the field it names, above the form, in the key dialog: alerts), so this copy is
   * hidden from screen readers: they hear "Failed" and the message once.
   */
  failed(message: string): void {
    this.say('Failed');
    this.line.append(hidden(`: ${message}`));
  }

  /** A step done: shown at once, read out at the first and then every few seconds. */
  step(step: number, steps: number): void {
    const text = `Step ${step} of ${steps}.`;
    const now = performance.now();
    if (!this.steps) {
      const spoken = Object.assign(document.createElement('span'), { className: 'visually-hidden', textContent: text });
      this.steps = { shown: hidden(text), spoken, at: now };
      this.line.replaceChildren(this.steps.shown, spoken);
      return;
    }
    this.steps.shown.textContent = text;
    if (now - this.steps.at < SPOKEN_EVERY_MS) return;
    this.steps.spoken.textContent = text;
    this.steps.at = now;
  }
}

/** Text for the eye only. */
function hidden(text: string): HTMLSpanElement {
  const span = Object.assign(document.createElement('span'), { textContent: text });
  span.setAttribute('aria-hidden', 'true');
  return span;
}
