import type { HostTensor } from '../../src/runtime/onnx-model.js';
import type { ModelLayout } from '../../src/models/layout.js';

/** A number from a component's config.json. */
function configNumber(config: Record<string, unknown>, key: string): number {
  const value = config[key];
  if (typeof value !== 'number') throw new Error(`config has no number '${key}'`);
  return value;
}

export interface DenoiserCall {
  feeds: Record<string, HostTensor>;
  output: string;
  /** The dims the output must have. */
  dims: number[];
}

/**
 * One call of a UNet or FLUX transformer at an image size, with zero inputs shaped from its config: the
 * part of a pipeline whose graph fixes which sizes run (the VAE runs at any multiple of 8).
 */
export function denoiserCall(layout: ModelLayout, width: number, height: number): DenoiserCall {
  const config = layout.denoiserConfig;
  const [w, h] = [width / layout.vae.scaleFactor, height / layout.vae.scaleFactor];
  const zeros = (...dims: number[]): HostTensor => ({ data: new Float32Array(dims.reduce((a, b) => a * b, 1)), dims });
  if (layout.family === 'flux') {
    const [tokens, text, channels] = [(h / 2) * (w / 2), 8, configNumber(config, 'in_channels')];
    const feeds = {
      hidden_states: zeros(1, tokens, channels),
      encoder_hidden_states: zeros(1, text, configNumber(config, 'joint_attention_dim')),
      pooled_projections: zeros(1, configNumber(config, 'pooled_projection_dim')),
      timestep: zeros(1),
      img_ids: zeros(tokens, 3),
      txt_ids: zeros(text, 3),
    };
    return { feeds, output: 'out_hidden_states', dims: [1, tokens, channels] };
  }
  const feeds: Record<string, HostTensor> = { sample: zeros(1, 4, h, w), timestep: zeros(1), encoder_hidden_states: zeros(1, 77, configNumber(config, 'cross_attention_dim')) };
  if (layout.family === 'sdxl') {
    const timeEmbeddings = 6 * configNumber(config, 'addition_time_embed_dim');
    feeds.text_embeds = zeros(1, configNumber(config, 'projection_class_embeddings_input_dim') - timeEmbeddings);
    feeds.time_ids = zeros(1, 6);
  }
  return { feeds, output: 'out_sample', dims: [1, 4, h, w] };
}
