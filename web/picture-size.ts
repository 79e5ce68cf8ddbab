import type { Model } from './api.js';

/**
 * The edit's picture against the form's size. The server scales an edit's picture, and its mask, to
 * cover the size and centre-crops it (docs/api.md), so a size of another shape cuts off the picture's
 * edges and whatever mask is painted there. So a picture chosen sets the size to the model's size of
 * the nearest shape, saying so, and a size of another shape is said to crop, its cut shaded on the mask.
 */

export interface Extent {
  width: number;
  height: number;
}

/** The part of a picture that a size keeps, as fractions of the picture's sides. */
interface Kept {
  left: number;
  top: number;
  width: number;
  height: number;
}

/** "768x512" as its sides; "auto" is the model's default size. */
function sidesOf(model: Model, size: string): Extent | undefined {
  const match = /^(\d+)x(\d+)$/.exec(size === 'auto' ? model.default_size : size);
  return match ? { width: Number(match[1]), height: Number(match[2]) } : undefined;
}

/** How far apart two shapes (or two areas) are, as a ratio's log: 2:1 is as far from 1:1 as 1:2. */
const apart = (a: number, b: number): number => Math.abs(Math.log(a / b));
const shapeApart = (a: Extent, b: Extent): number => apart(a.width / a.height, b.width / b.height);

/**
 * The size of `model` for a picture: `current` when no size has a nearer shape (the user's choice
 * stands), else of the sizes of the nearest shape, the one nearest the picture's area.
 */
function sizeFor(model: Model, current: string, picture: Extent): string {
  const sizes = model.sizes.flatMap((size) => {
    const sides = sidesOf(model, size);
    return sides && size !== 'auto' ? [{ size, sides, off: shapeApart(sides, picture) }] : [];
  });
  const nearest = Math.min(...sizes.map(({ off }) => off));
  const now = sidesOf(model, current);
  // A hair of slack: 768x512 and 1536x1024 are the same shape, whatever the floating point says.
  if (!sizes.length || (now && shapeApart(now, picture) <= nearest + 1e-9)) return current;
  const area = (e: Extent) => e.width * e.height;
  const shaped = sizes.filter(({ off }) => off <= nearest + 1e-9);
  shaped.sort((a, b) => apart(area(a.sides), area(picture)) - apart(area(b.sides), area(picture)));
  return shaped[0].size;
}

/** What a size keeps of the picture (scaled to cover it, centre-cropped); undefined when it keeps all, to within a picture pixel. */
function keptOf(picture: Extent, size: Extent): Kept | undefined {
  const scale = Math.max(size.width / picture.width, size.height / picture.height);
  const [width, height] = [size.width / scale / picture.width, size.height / scale / picture.height];
  if ((1 - width) * picture.width < 1 && (1 - height) * picture.height < 1) return undefined;
  return { left: (1 - width) / 2, top: (1 - height) / 2, width, height };
}

/** The size field, its help line and the two bands that shade a cut over the mask, for the picture in the edit panel. */
export class PictureSize {
  private picture: Extent | undefined;

  constructor(
    private readonly select: HTMLSelectElement,
    private readonly help: HTMLElement,
    private readonly bands: readonly HTMLElement[],
  ) {}

  /** A new picture: the size set to its shape where the model has one. Says what it did, or what the size cuts off ('' when nothing). */
  fit(model: Model | undefined, picture: Extent): string {
    this.picture = picture;
    const size = model ? sizeFor(model, this.select.value, picture) : this.select.value;
    const changed = size !== this.select.value;
    this.select.value = size;
    const cut = this.show(model);
    if (!changed) return cut;
    // A model with no size of the picture's shape (a gpt-image name's 1024x1024 for a wide photo): the
    // nearest one, which still crops, is not said to match it.
    const shape = `${picture.width}x${picture.height}`;
    return cut ? `Size set to ${size}, the nearest this model has to the picture's shape (${shape}). ${cut}` : `Size set to ${size} to match the picture's shape (${shape}).`;
  }

  /**
   * Another model chosen, its sizes offered: where it lacks the size chosen before (`previous`), the list
   * fell back to its default size, which the user did not choose and which may crop the picture; the
   * size is then fitted to the picture as when one is chosen. Says what it did, or what the size cuts off.
   */
  modelChosen(model: Model | undefined, previous: string): string {
    return this.picture && this.select.value !== previous ? this.fit(model, this.picture) : this.show(model);
  }

  /** Shows what the chosen size cuts off the picture, if any; returns the sentence that says so ('' when nothing is cut). */
  show(model: Model | undefined): string {
    const sides = model && this.picture && sidesOf(model, this.select.value);
    const kept = sides && this.picture ? keptOf(this.picture, sides) : undefined;
    const percent = (fraction: number) => `${fraction * 100}%`;
    // A cover crop cuts one pair of sides: left and right (the picture is wider than the size) or top and bottom.
    const across = kept !== undefined && kept.width < kept.height;
    this.bands.forEach((band, i) => {
      band.hidden = !kept;
      if (!kept) return;
      const [start, cut] = across ? [i ? kept.left + kept.width : 0, kept.left] : [i ? kept.top + kept.height : 0, kept.top];
      Object.assign(band.style, across ? { left: percent(start), top: '0', width: percent(cut), height: '100%' } : { left: '0', top: percent(start), width: '100%', height: percent(cut) });
    });
    const { width, height } = this.picture ?? { width: 0, height: 0 };
    this.help.textContent = kept ? `The picture to edit (${width}x${height}) is of another shape: it will be cropped to ${this.select.value}, losing its shaded ${across ? 'left and right' : 'top and bottom'} edges, mask included.` : '';
    return this.help.textContent;
  }
}
