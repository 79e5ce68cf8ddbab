/**
 * The pixel errors `imagegen models verify` passes (see golden.ts), apart from golden.ts: the command's
 * --help shows them, and loads none of what reads golden files and runs models (sharp, the pipelines).
 */

/**
 * The default bound on the largest pixel error (0..1 scale). Both pictures are 8-bit, so rounding
 * alone puts a pixel 1/255 off when diffusers' float value and ours straddle a rounding boundary;
 * onnxruntime and torch agree to ~1e-5 on fp32 graphs, far below a level. Mistakes land well above:
 * a wrong token id, timestep or guidance costs 2.6/255 or more.
 */
export const DEFAULT_TOLERANCE = 1.5 / 255;

/**
 * fp16 graphs on onnxruntime's CPU provider: weights, graph inputs/outputs and values passing through
 * data-movement ops are rounded to 11 bits (the arithmetic runs in float32 between the Casts onnxruntime
 * inserts). The fp16 conversions of the real exports land at most 2/255 off (sd2v; 1/255 elsewhere);
 * 2.5/255 allows that and still fails guidance off by 0.5 (3/255 on sd15 case 1, which 3/255 would pass).
 */
export const FP16_TOLERANCE = 2.5 / 255;
