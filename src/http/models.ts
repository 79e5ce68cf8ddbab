import type { FastifyInstance } from 'fastify';
import type { ListedModel, ModelRegistry } from '../models/registry.js';
import { dialectOf, qualitiesOf, servedSizes } from '../api/dialects.js';
import { ApiError } from '../api/errors.js';
import { invalidUrl } from './errors.js';
import type { ModelList, ModelObject } from '../api/wire.js';

/**
 * GET /v1/models and /v1/models/:id in OpenAI's shape, plus the sizes a request may name under each id
 * and the one it gets without: under a gpt-image name those are `auto` and the sizes of the model that
 * OpenAI's model of that name takes (dialects.ts servedSizes), so a client offering them offers none
 * that would be refused; the qualities it takes under that id (qualitiesOf); and what it can do
 * (edits need image-to-image or inpainting) with which samplers; and which one requests naming no model get.
 */

export interface ModelsOptions {
  registry: ModelRegistry;
  /** DEFAULT_MODEL: its entry is marked `default`. */
  defaultModel: string;
}

function toModelObject({ id, model }: ListedModel, defaultModel: string): ModelObject {
  const gptImage = dialectOf(id) === 'gpt-image';
  return {
    id,
    object: 'model',
    created: model.created,
    owned_by: model.ownedBy,
    sizes: gptImage ? ['auto', ...servedSizes(id, model.preset.sizes)] : model.preset.sizes,
    default_size: gptImage ? 'auto' : model.preset.defaultSize,
    qualities: [...qualitiesOf(id)],
    // A client can tell before it tries whether edits and variations work here (an export without its VAE encoder cannot).
    capabilities: model.capabilities,
    schedulers: model.schedulers,
    // The installed models come sorted by id (then aliases), so the first entry is no default: the embedded demo model sorts before
    // most real ones, and a client (the playground) offering the first would draw with it.
    default: id === defaultModel,
  };
}

export async function models(app: FastifyInstance, { registry, defaultModel }: ModelsOptions): Promise<void> {
  app.get('/v1/models', async (): Promise<ModelList> => {
    await registry.refresh();
    return { object: 'list', data: registry.list().map((listed) => toModelObject(listed, defaultModel)) };
  });

  app.get<{ Params: { id: string } }>('/v1/models/:id', async (request): Promise<ModelObject> => {
    const { id } = request.params;
    // `/v1/models/` names no model: the URL is wrong, not the model.
    if (id === '') throw invalidUrl(request);
    const model = await registry.resolve(id);
    if (!model) {
      const unusable = registry.unusableReason(id);
      throw new ApiError(404, `The model '${id}' ${unusable ? `is installed but cannot be used (${unusable})` : 'does not exist'}`, { param: 'model', code: 'model_not_found' });
    }
    return toModelObject({ id, model }, defaultModel);
  });
}
