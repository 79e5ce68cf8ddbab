/**
 * Reads back what a picture of the reference models shows: the colour of the figure and its shape,
 * from how much of its bounding box the figure fills (square ~1, circle ~pi/4, triangle ~1/2).
 */

import sharp, { type OutputInfo } from 'sharp';
import { BACKGROUND, COLOURS } from '../../src/reference/concepts.js';

type Rgb = readonly [number, number, number];

const to255 = (c: readonly number[]): Rgb => [c[0] * 255, c[1] * 255, c[2] * 255];
/** The reference models' colours and background in 0..255. */
const PALETTE: Record<string, Rgb> = Object.fromEntries(Object.entries(COLOURS).map(([name, c]) => [name, to255(c)]));
const BACKGROUND_RGB: Rgb = to255(BACKGROUND);

export interface Reading {
  colour: string;
  shape: 'square' | 'circle' | 'triangle' | 'unknown';
  /** Figure pixels / bounding-box pixels. */
  fill: number;
  /** Share of the picture covered by the figure. */
  coverage: number;
  /** Mean distance of figure pixels from the named colour (0..441); small means a clean, saturated figure. */
  colourError: number;
  /** Mean distance of background pixels from the plain background: residual noise a right sampler removes. */
  backgroundNoise: number;
}

/** Pixels further than this from the background colour belong to the figure. */
const FIGURE_THRESHOLD = 60;

function distance(a: Rgb, b: Rgb): number {
  return Math.hypot(a[0] - b[0], a[1] - b[1], a[2] - b[2]);
}

function pixel(rgb: Uint8Array, i: number): Rgb {
  return [rgb[i * 3], rgb[i * 3 + 1], rgb[i * 3 + 2]];
}

/** Pixels this far from the figure's box are pure background: the decoder's blur does not reach them. */
const EDGE_MARGIN = 12;

function meanBackgroundDistance(rgb: Uint8Array, width: number, height: number, background: Rgb, box: number[]): number {
  const [minX, minY, maxX, maxY] = box;
  let [total, count] = [0, 0];
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      if (x >= minX - EDGE_MARGIN && x <= maxX + EDGE_MARGIN && y >= minY - EDGE_MARGIN && y <= maxY + EDGE_MARGIN) continue;
      total += distance(pixel(rgb, y * width + x), background);
      count++;
    }
  }
  return count ? total / count : 0;
}

/** What raw 8-bit RGB pixels show, in the reference models' palette. */
export function readPicture(rgb: Uint8Array, width: number, height: number): Reading {
  const [palette, background] = [PALETTE, BACKGROUND_RGB];
  let [minX, minY, maxX, maxY, count] = [width, height, -1, -1, 0];
  const sum = [0, 0, 0];
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      const p = pixel(rgb, y * width + x);
      if (distance(p, background) <= FIGURE_THRESHOLD) continue;
      count++;
      sum[0] += p[0];
      sum[1] += p[1];
      sum[2] += p[2];
      minX = Math.min(minX, x);
      maxX = Math.max(maxX, x);
      minY = Math.min(minY, y);
      maxY = Math.max(maxY, y);
    }
  }
  const backgroundNoise = meanBackgroundDistance(rgb, width, height, background, [minX, minY, maxX, maxY]);
  if (count === 0) return { colour: 'none', shape: 'unknown', fill: 0, coverage: 0, colourError: Infinity, backgroundNoise };
  const mean: Rgb = [sum[0] / count, sum[1] / count, sum[2] / count];
  const [colour, colourError] = Object.entries(palette)
    .map(([name, c]) => [name, distance(mean, c)] as const)
    .reduce((best, cur) => (cur[1] < best[1] ? cur : best));
  const fill = count / ((maxX - minX + 1) * (maxY - minY + 1));
  const shape = fill > 0.9 ? 'square' : fill > 0.66 && fill < 0.87 ? 'circle' : fill > 0.38 && fill < 0.62 ? 'triangle' : 'unknown';
  return { colour, shape, fill, coverage: count / (width * height), colourError, backgroundNoise };
}

/** An encoded image (file path or bytes) decoded, and what it shows. */
export async function readImageFile(input: string | Buffer): Promise<{ info: OutputInfo; reading: Reading }> {
  const { data, info } = await sharp(input).removeAlpha().raw().toBuffer({ resolveWithObject: true });
  return { info, reading: readPicture(new Uint8Array(data), info.width, info.height) };
}
