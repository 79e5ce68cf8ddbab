/**
 * The words the reference models understand. Each colour and each shape is one "concept": one
 * dimension of the text encoders' hidden vectors and one attribute of every prototype picture.
 */

/** Fill colours, RGB in 0..1. */
export const COLOURS = {
  red: [0.9, 0.1, 0.1],
  green: [0.1, 0.7, 0.2],
  blue: [0.1, 0.2, 0.9],
  yellow: [0.95, 0.85, 0.1],
  orange: [0.95, 0.5, 0.05],
  purple: [0.55, 0.15, 0.75],
  white: [0.97, 0.97, 0.97],
  black: [0.05, 0.05, 0.05],
} as const satisfies Record<string, readonly [number, number, number]>;

export type ColourName = keyof typeof COLOURS;
export const COLOUR_NAMES = Object.keys(COLOURS) as ColourName[];

export const SHAPES = ['circle', 'square', 'triangle'] as const;
export type ShapeName = (typeof SHAPES)[number];

/** Every prototype is drawn on this neutral grey: RGB 0 in the [-1, 1] range, so the zero latent. */
export const BACKGROUND = [0.5, 0.5, 0.5] as const;

export type ConceptName = ColourName | ShapeName;

/** Concept dimension order: the colours, then the shapes. */
export const CONCEPTS: readonly ConceptName[] = [...COLOUR_NAMES, ...SHAPES];
export const COLOUR_DIMS = { from: 0, to: COLOUR_NAMES.length };
export const SHAPE_DIMS = { from: COLOUR_NAMES.length, to: CONCEPTS.length };

/** Other words for the same concepts. */
export const SYNONYMS: Readonly<Record<string, ConceptName>> = {
  crimson: 'red',
  scarlet: 'red',
  gold: 'yellow',
  golden: 'yellow',
  violet: 'purple',
  circles: 'circle',
  round: 'circle',
  disc: 'circle',
  disk: 'circle',
  dot: 'circle',
  ball: 'circle',
  squares: 'square',
  box: 'square',
  boxes: 'square',
  triangles: 'triangle',
  triangular: 'triangle',
};

/**
 * Words that carry no concept but are common in prompts; giving them whole-word tokens keeps prompts
 * short in tokens, as a real vocabulary would.
 */
const FILLER_WORDS = ['a', 'an', 'the', 'of', 'on', 'in', 'and', 'with', 'big', 'small', 'large', 'shape', 'picture', 'photo', 'background'];

/** Every word with a concept, in a fixed order: the concept names, then the synonyms. */
export const CONCEPT_WORDS: ReadonlyArray<readonly [word: string, concept: number]> = [
  ...CONCEPTS.map((name, i) => [name, i] as const),
  ...Object.entries(SYNONYMS).map(([word, name]) => [word, CONCEPTS.indexOf(name)] as const),
];

/** The words both reference vocabularies (CLIP and T5) make whole tokens of. */
export const VOCABULARY_WORDS: readonly string[] = [...CONCEPT_WORDS.map(([word]) => word), ...FILLER_WORDS];
