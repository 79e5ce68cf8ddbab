/**
 * Reference models: small diffusion models whose correct output is known in closed form, written in
 * the real exports' folder layouts and tensor signatures (see shared/design/reference-models.md).
 */
export { buildDefaultModel, buildFamily, buildReferenceModels, DEFAULT_MODEL_DIR, type BuildSummary } from './build.js';
export { REFERENCE_FAMILIES } from './families.js';
export { BACKGROUND, COLOUR_NAMES, COLOURS, CONCEPTS, SHAPES, SYNONYMS, type ColourName, type ShapeName } from './concepts.js';
export { BANK_SIZE, drawPrototype, MASK_COUNT, PLACEMENTS, PROTOTYPE_IMAGE_SIZE, PROTOTYPES, prototypeBank } from './prototypes.js';
export { latentCode } from './latent-code.js';
export { referenceClipVocabulary } from './clip-vocabulary.js';
export { referenceT5Vocabulary } from './t5-vocabulary.js';
export { sdSigmas } from './unet.js';
