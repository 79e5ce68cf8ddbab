import { BACKGROUND, COLOURS } from '../../src/reference/concepts.js';
import type { Rgb } from './picture.js';

const to255 = (c: readonly number[]): Rgb => [c[0] * 255, c[1] * 255, c[2] * 255];

/** The reference models' colours and background in 0..255. */
export const PALETTE: Record<string, Rgb> = Object.fromEntries(Object.entries(COLOURS).map(([name, c]) => [name, to255(c)]));
export const BACKGROUND_RGB: Rgb = to255(BACKGROUND);
