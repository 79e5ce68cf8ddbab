/**
 * The prototype pictures: the finite "training set" whose exact denoiser the reference UNet and FLUX
 * transformer compute. Each is one filled, anti-aliased shape on the grey background.
 */
import { BACKGROUND, COLOUR_NAMES, COLOURS, CONCEPTS, SHAPES, type ColourName, type ShapeName } from './concepts.js';
import { encodeImage, VAE_SCALE } from './latent-code.js';

/** Where a shape sits, as fractions of the image side: its centre and its size (circle diameter, square or triangle side). */
export interface Placement {
  cx: number;
  cy: number;
  size: number;
}

/** One large centred shape and several smaller ones, so seeds give visibly different pictures. */
export const PLACEMENTS: readonly Placement[] = [
  { cx: 0.5, cy: 0.5, size: 0.62 },
  { cx: 0.3, cy: 0.3, size: 0.36 },
  { cx: 0.7, cy: 0.3, size: 0.36 },
  { cx: 0.3, cy: 0.7, size: 0.36 },
  { cx: 0.7, cy: 0.7, size: 0.36 },
  { cx: 0.42, cy: 0.56, size: 0.48 },
];

export interface Prototype {
  colour: ColourName;
  shape: ShapeName;
  placement: Placement;
}

/** Ordered colour-major, then shape, then placement: index = (colour * 3 + shape) * placements + placement. */
export const PROTOTYPES: readonly Prototype[] = COLOUR_NAMES.flatMap((colour) =>
  SHAPES.flatMap((shape) => PLACEMENTS.map((placement) => ({ colour, shape, placement }))),
);

/** Prototypes are drawn at this size; the bank holds their latents at size / 8. */
export const PROTOTYPE_IMAGE_SIZE = 256;
export const BANK_SIZE = PROTOTYPE_IMAGE_SIZE / VAE_SCALE;

/** Samples per pixel side for anti-aliasing (coverage = fraction of the 4x4 samples inside). */
const SUPERSAMPLE = 4;
const SQRT3 = Math.sqrt(3);

/** Is the point (x, y), in image-side fractions, inside the shape? Only exact arithmetic, so every machine draws the same bits. */
function inside(shape: ShapeName, p: Placement, x: number, y: number): boolean {
  const dx = x - p.cx;
  const dy = y - p.cy;
  const half = p.size / 2;
  switch (shape) {
    case 'circle':
      return dx * dx + dy * dy <= half * half;
    case 'square':
      return Math.abs(dx) <= half && Math.abs(dy) <= half;
    case 'triangle': {
      // Equilateral, pointing up, its bounding box centred on (cx, cy).
      const h = (p.size * SQRT3) / 2;
      const fromApex = dy + h / 2;
      return fromApex >= 0 && fromApex <= h && Math.abs(dx) <= fromApex / SQRT3;
    }
  }
}

/** Draws a prototype as a CHW RGB image with values in 0..1. */
export function drawPrototype(proto: Prototype, size = PROTOTYPE_IMAGE_SIZE): Float32Array {
  const image = new Float32Array(3 * size * size);
  const fill = COLOURS[proto.colour];
  const step = 1 / (size * SUPERSAMPLE);
  for (let py = 0; py < size; py++) {
    for (let px = 0; px < size; px++) {
      let hits = 0;
      for (let sy = 0; sy < SUPERSAMPLE; sy++) {
        for (let sx = 0; sx < SUPERSAMPLE; sx++) {
          const x = (px * SUPERSAMPLE + sx + 0.5) * step;
          const y = (py * SUPERSAMPLE + sy + 0.5) * step;
          if (inside(proto.shape, proto.placement, x, y)) hits++;
        }
      }
      const coverage = hits / (SUPERSAMPLE * SUPERSAMPLE);
      for (let k = 0; k < 3; k++) image[(k * size + py) * size + px] = BACKGROUND[k] + coverage * (fill[k] - BACKGROUND[k]);
    }
  }
  return image;
}

export interface PrototypeBank {
  /** Number of prototypes (K). */
  count: number;
  channels: number;
  /** Model-space latents [K, C, BANK_SIZE, BANK_SIZE]. */
  latents: Float32Array;
  /** Attribute indicators A^T as [concepts, K]: A[d][k] = 1 when prototype k has colour or shape d. */
  attributes: Float32Array;
}

const banks = new Map<number, PrototypeBank>();

/** The encoded prototypes for a latent channel count; drawn once per process. */
export function prototypeBank(channels: number): PrototypeBank {
  const cached = banks.get(channels);
  if (cached) return cached;
  const count = PROTOTYPES.length;
  const plane = channels * BANK_SIZE * BANK_SIZE;
  const latents = new Float32Array(count * plane);
  const attributes = new Float32Array(CONCEPTS.length * count);
  PROTOTYPES.forEach((proto, k) => {
    const image = drawPrototype(proto);
    latents.set(encodeImage(image, PROTOTYPE_IMAGE_SIZE, PROTOTYPE_IMAGE_SIZE, channels), k * plane);
    attributes[CONCEPTS.indexOf(proto.colour) * count + k] = 1;
    attributes[CONCEPTS.indexOf(proto.shape) * count + k] = 1;
  });
  const bank = { count, channels, latents, attributes };
  banks.set(channels, bank);
  return bank;
}
