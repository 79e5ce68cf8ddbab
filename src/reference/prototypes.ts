/**
 * The prototype pictures: the finite "training set" whose exact denoiser the reference UNet and FLUX
 * transformer compute. Each is one filled, anti-aliased shape of one colour on the grey background.
 *
 * The grey background encodes to the zero latent and the latent code is linear, so a prototype's
 * latent factorises: z[channel, pixel] = code(colour)[channel] * mask(shape, placement)[pixel], where
 * the mask is the shape's coverage of each latent pixel's 8x8 block. The models store only the colour
 * codes and the masks: well over a thousand prototypes in under a megabyte.
 */
import { BACKGROUND, COLOUR_NAMES, COLOURS, SHAPES, type ColourName, type ShapeName } from './concepts.js';
import { latentCode, VAE_SCALE } from './latent-code.js';

/**
 * Where a shape sits, as fractions of the image side: its centre and its size, the side of the square
 * of the same area. All shapes of one size cover the same area: few-step, high-guidance samplers
 * score prototypes by their overlap with a still blurry picture, where a larger square would outscore
 * the triangle the prompt asked for.
 */
export interface Placement {
  cx: number;
  cy: number;
  size: number;
}

const SQRT3 = Math.sqrt(3);
/** Side of the equilateral triangle of area 1, the widest of the shapes: 2 / 3^(1/4). */
const TRIANGLE_SIDE = 2 / Math.sqrt(SQRT3);
/** Diameter of the circle of area 1: 2 / sqrt(pi). */
const CIRCLE_DIAMETER = 2 / Math.sqrt(Math.PI);

/**
 * Shape sizes, each on an n x n grid of centres: small shapes have room for more positions. The
 * closest two masks of a shape differ by ||m_i - m_j||^2 >= 40 (latent pixels at 32x32), so a 4-step
 * sampler settles on one picture rather than a blend of neighbours, and neighbouring pictures visibly
 * differ.
 *
 * The sizes give the prototypes different norms, so a sampler that mis-scales its input lands on
 * wrong prototypes (with one size, pipelines.test.ts's skipped input scaling went unnoticed). The
 * price: samplers on SD's schedule start from pure noise although t = 999 still holds some signal,
 * which favours prototypes of small norm, the more so the larger the picture: at 1024x1024 the demo
 * draws only the smallest size.
 */
const SIZE_GRIDS = [
  { size: 0.48, positions: 3 },
  { size: 0.4, positions: 5 },
  { size: 0.28, positions: 6 },
] as const;
/** Every shape stays this far inside the picture's edges, so no placement is cut off. */
const MARGIN = 0.065;

/** Size-major, then row, then column: 70 placements, so "a red circle" has 70 possible pictures. */
export const PLACEMENTS: readonly Placement[] = SIZE_GRIDS.flatMap(({ size, positions }) => {
  const first = MARGIN + (size * TRIANGLE_SIDE) / 2;
  const step = (1 - 2 * first) / (positions - 1);
  const centres = Array.from({ length: positions }, (_, i) => first + i * step);
  return centres.flatMap((cy) => centres.map((cx) => ({ cx, cy, size })));
});

/** One mask per shape and placement. */
export const MASK_COUNT = SHAPES.length * PLACEMENTS.length;

export interface Prototype {
  colour: ColourName;
  shape: ShapeName;
  placement: Placement;
}

/**
 * Ordered colour-major, then shape, then placement: index = (colour * shapes + shape) * placements +
 * placement, so that index = colour * masks + mask, the layout the denoisers' [colours, masks] grid uses.
 */
export const PROTOTYPES: readonly Prototype[] = COLOUR_NAMES.flatMap((colour) =>
  SHAPES.flatMap((shape) => PLACEMENTS.map((placement) => ({ colour, shape, placement }))),
);

/** Prototypes are drawn at this size; the masks are their coverage at size / 8. */
export const PROTOTYPE_IMAGE_SIZE = 256;
export const BANK_SIZE = PROTOTYPE_IMAGE_SIZE / VAE_SCALE;

/** Samples per pixel side for anti-aliasing (coverage = fraction of the 4x4 samples inside). */
const SUPERSAMPLE = 4;

/** Is the point (x, y), in image-side fractions, inside the shape? Only exact arithmetic, so every machine draws the same bits. */
function inside(shape: ShapeName, p: Placement, x: number, y: number): boolean {
  const dx = x - p.cx;
  const dy = y - p.cy;
  switch (shape) {
    case 'circle': {
      const radius = (p.size * CIRCLE_DIAMETER) / 2;
      return dx * dx + dy * dy <= radius * radius;
    }
    case 'square':
      return Math.abs(dx) <= p.size / 2 && Math.abs(dy) <= p.size / 2;
    case 'triangle': {
      // Equilateral, pointing up, its bounding box centred on (cx, cy).
      const h = (p.size * TRIANGLE_SIDE * SQRT3) / 2;
      const fromApex = dy + h / 2;
      return fromApex >= 0 && fromApex <= h && Math.abs(dx) <= fromApex / SQRT3;
    }
  }
}

/** The fraction of each pixel the shape covers, [size, size] row-major. */
function coverage(shape: ShapeName, placement: Placement, size: number): Float32Array {
  const covered = new Float32Array(size * size);
  const step = 1 / (size * SUPERSAMPLE);
  // Every shape fits in the box as wide as the triangle around the centre: pixels outside it stay 0.
  const extent = (placement.size * TRIANGLE_SIDE) / 2;
  const pixelRange = (centre: number) => [Math.max(0, Math.floor((centre - extent) * size)), Math.min(size, Math.ceil((centre + extent) * size))];
  const [fromY, toY] = pixelRange(placement.cy);
  const [fromX, toX] = pixelRange(placement.cx);
  for (let py = fromY; py < toY; py++) {
    for (let px = fromX; px < toX; px++) {
      let hits = 0;
      for (let sy = 0; sy < SUPERSAMPLE; sy++) {
        for (let sx = 0; sx < SUPERSAMPLE; sx++) {
          if (inside(shape, placement, (px * SUPERSAMPLE + sx + 0.5) * step, (py * SUPERSAMPLE + sy + 0.5) * step)) hits++;
        }
      }
      covered[py * size + px] = hits / (SUPERSAMPLE * SUPERSAMPLE);
    }
  }
  return covered;
}

/** Draws a prototype as a CHW RGB image with values in 0..1. */
export function drawPrototype(proto: Prototype): Float32Array {
  const size = PROTOTYPE_IMAGE_SIZE;
  const covered = coverage(proto.shape, proto.placement, size);
  const image = new Float32Array(3 * size * size);
  const fill = COLOURS[proto.colour];
  for (let k = 0; k < 3; k++) {
    for (let p = 0; p < size * size; p++) image[k * size * size + p] = BACKGROUND[k] + covered[p] * (fill[k] - BACKGROUND[k]);
  }
  return image;
}

export interface PrototypeBank {
  channels: number;
  /** [colours, channels]: the model-space latent of a pixel fully covered by each colour. */
  colourCodes: Float32Array;
  /**
   * [shapes * placements, BANK_SIZE, BANK_SIZE], shape-major: each shape-placement's mean coverage
   * of every latent pixel's 8x8 block, as the reference VAE encoder averages it.
   */
  masks: Float32Array;
}

/** The masks are the same for every channel count; drawn once per process. */
let masks: Float32Array | undefined;

function shapeMasks(): Float32Array {
  if (masks) return masks;
  const plane = BANK_SIZE * BANK_SIZE;
  masks = new Float32Array(MASK_COUNT * plane);
  for (const [s, shape] of SHAPES.entries()) {
    for (const [p, placement] of PLACEMENTS.entries()) {
      const covered = coverage(shape, placement, PROTOTYPE_IMAGE_SIZE);
      const m = s * PLACEMENTS.length + p;
      const mask = masks.subarray(m * plane, (m + 1) * plane);
      for (let y = 0; y < PROTOTYPE_IMAGE_SIZE; y++) {
        for (let x = 0; x < PROTOTYPE_IMAGE_SIZE; x++) mask[Math.floor(y / VAE_SCALE) * BANK_SIZE + Math.floor(x / VAE_SCALE)] += covered[y * PROTOTYPE_IMAGE_SIZE + x];
      }
      for (let i = 0; i < plane; i++) mask[i] /= VAE_SCALE * VAE_SCALE;
    }
  }
  return masks;
}

/** The prototypes' factors for a latent channel count. */
export function prototypeBank(channels: number): PrototypeBank {
  const code = latentCode(channels);
  const colourCodes = new Float32Array(COLOUR_NAMES.length * channels);
  COLOUR_NAMES.forEach((name, i) => {
    // The fill's RGB in [-1, 1], where the grey background is 0.
    const rgb = COLOURS[name].map((v, k) => 2 * (v - BACKGROUND[k]));
    for (let c = 0; c < channels; c++) colourCodes[i * channels + c] = code[c * 3] * rgb[0] + code[c * 3 + 1] * rgb[1] + code[c * 3 + 2] * rgb[2];
  });
  return { channels, colourCodes, masks: shapeMasks() };
}
