import Fastify, { type FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import type { Config } from '../config.js';
import type { EnginePool } from '../engine/pool.js';
import type { ModelRegistry } from '../models/registry.js';
import type { Metrics } from '../observability/metrics.js';
import { createImageService } from '../service/images.js';
import type { ImageStore } from '../store/image-store.js';
import { auth } from './auth.js';
import { answerClientError, answerFrameworkError, errors } from './errors.js';
import { files } from './files.js';
import { health } from './health.js';
import { images } from './images.js';
import { metricsRoutes } from './metrics.js';
import { models } from './models.js';
import { requestId, requestIds } from './request-id.js';
import { shutdown } from './shutdown.js';

/** The HTTP app, assembled from one plugin per concern; the caller owns the parts it is given. */

export interface AppParts {
  config: Pick<Config, 'apiKeys' | 'bodyLimit' | 'trustProxy' | 'publicBaseUrl' | 'shutdownTimeoutSeconds' | 'metricsPublic' | 'logPrompts'>;
  registry: ModelRegistry;
  engine: EnginePool;
  store: ImageStore;
  metrics: Metrics;
  logger: Logger;
  /** PEM certificate and key: serve HTTPS. */
  tls?: { cert: Buffer; key: Buffer };
}

export function buildApp({ config, registry, engine, store, metrics, logger, tls }: AppParts): FastifyInstance {
  const app = Fastify({
    loggerInstance: logger,
    genReqId: requestId,
    bodyLimit: config.bodyLimit,
    trustProxy: config.trustProxy,
    // Our own shutdown hook answers in OpenAI's error shape instead.
    return503OnClosing: false,
    // Requests refused before routing, in OpenAI's error shape too.
    clientErrorHandler: answerClientError,
    frameworkErrors: answerFrameworkError,
    ...(tls && { https: tls }),
  }) as unknown as FastifyInstance;

  app.register(errors);
  app.register(requestIds);
  // Before the plugins whose hooks reject requests, so that those are counted too.
  app.register(metricsRoutes, { metrics, public: config.metricsPublic });
  app.register(shutdown, { timeoutMs: config.shutdownTimeoutSeconds * 1000 });
  app.register(auth, { apiKeys: config.apiKeys });
  app.register(health, { engine });
  app.register(models, { registry });
  app.register(files, { store });
  app.register(images, {
    service: createImageService({ registry, engine, store }),
    publicBaseUrl: config.publicBaseUrl,
    logPrompts: config.logPrompts,
  });
  return app;
}
