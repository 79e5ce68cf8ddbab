import type { FastifyInstance } from 'fastify';
import type { ListedModel, ModelRegistry } from '../models/registry.js';
import { ApiError } from '../api/errors.js';
import type { ModelList, ModelObject } from '../api/wire.js';

/** GET /v1/models and /v1/models/:id in OpenAI's shape, plus each model's sizes. */

export interface ModelsOptions {
  registry: ModelRegistry;
}

function toModelObject({ id, model }: ListedModel): ModelObject {
  return {
    id,
    object: 'model',
    created: model.created,
    owned_by: model.ownedBy,
    sizes: model.preset.sizes,
    default_size: model.preset.defaultSize,
  };
}

export async function models(app: FastifyInstance, { registry }: ModelsOptions): Promise<void> {
  app.get('/v1/models', async (): Promise<ModelList> => {
    await registry.refresh();
    return { object: 'list', data: registry.list().map(toModelObject) };
  });

  app.get<{ Params: { id: string } }>('/v1/models/:id', async (request): Promise<ModelObject> => {
    const { id } = request.params;
    const model = await registry.resolve(id);
    if (!model) {
      const unusable = registry.unusableReason(id);
      throw new ApiError(404, `The model '${id}' ${unusable ? `is installed but cannot be used (${unusable})` : 'does not exist'}`, { param: 'model', code: 'model_not_found' });
    }
    return toModelObject({ id, model });
  });
}
