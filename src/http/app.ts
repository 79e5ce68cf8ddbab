import Fastify, { type FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import type { Config } from '../config.js';
import type { ModelRegistry } from '../models/registry.js';
import type { Metrics } from '../observability/metrics.js';
import { createImageService, type ImageEngine } from '../service/images.js';
import type { ImageStore } from '../store/image-store.js';
import { ByteBudget } from '../util/byte-budget.js';
import { auth } from './auth.js';
import { connectionOptions, connections } from './connections.js';
import { content } from './content.js';
import { cors } from './cors.js';
import { edits, LARGEST_FORM_BYTES } from './edits.js';
import { answerClientError, answerFrameworkError, errors, unrouted } from './errors.js';
import { expectContinue } from './expect.js';
import { files } from './files.js';
import { health, type HealthEngine } from './health.js';
import { hostCheck } from './host.js';
import { images } from './images.js';
import { KeyRates } from './key-rates.js';
import type { KeySlots } from './key-slots.js';
import { httpLogger, RequestLog } from './logging.js';
import { BEFORE_ROUTING, countRequest, metricsRoutes } from './metrics.js';
import { models } from './models.js';
import { playground } from './playground.js';
import { requestId, requestIds } from './request-id.js';
import { shutdown } from './shutdown.js';

/** The HTTP app, assembled from one plugin per concern; the caller owns the parts it is given. */

/** The settings the HTTP layer reads. */
export type AppConfig = Pick<
  Config,
  | 'apiKeys'
  | 'apiKeysFile'
  | 'bodyLimit'
  | 'uploadMemory'
  | 'answerMemory'
  | 'queueTimeoutSeconds'
  | 'rng'
  | 'trustProxy'
  | 'publicBaseUrl'
  | 'shutdownTimeoutSeconds'
  | 'metricsPublic'
  | 'logPrompts'
  | 'defaultModel'
  | 'corsOrigins'
  | 'headersTimeoutSeconds'
  | 'requestTimeoutSeconds'
  | 'keepAliveTimeoutSeconds'
  | 'sendTimeoutSeconds'
  | 'streamKeepAliveSeconds'
  | 'sendMinRate'
  | 'maxConnections'
  | 'playground'
>;

export interface AppParts {
  config: AppConfig;
  registry: ModelRegistry;
  engine: ImageEngine & HealthEngine;
  store: ImageStore;
  metrics: Metrics;
  logger: Logger;
  /** PEM certificate and key: serve HTTPS. */
  tls?: { cert: Buffer; key: Buffer };
  /** API_KEYS_FILE's per-minute limits; default: counted in this process (server.ts shares them through Redis with REDIS_URL). */
  rates?: KeyRates;
  /** API keys' `concurrent` slots over all replicas (server.ts, with REDIS_URL); without: each server's queue counts them. */
  slots?: KeySlots;
}

/** Route parameters (a model id in /v1/models/{id}) up to a file name's 255 bytes, percent-encoded where need be. */
export const MAX_PARAM_LENGTH = 768;

export function buildApp({ config, registry, engine, store, metrics, logger, tls, rates = new KeyRates(), slots }: AppParts): FastifyInstance {
  const { http, ...timeouts } = connectionOptions(config);
  const requestLog = new RequestLog();
  const app = Fastify({
    loggerInstance: httpLogger(logger),
    logController: requestLog,
    genReqId: requestId,
    ...timeouts,
    http,
    bodyLimit: config.bodyLimit,
    // Fastify's default of 100 answered 414 for model ids that /v1/models lists. A base URL set with a
    // trailing slash (http://host:8000/v1/) makes clients that join paths by hand (LiteLLM, openai 3.x's
    // axios, many scripts) ask for /v1//images/generations: found as if the slash were single. Routing
    // alone reads the path (auth and CORS go by the route found), so nothing else sees it differently.
    routerOptions: { maxParamLength: MAX_PARAM_LENGTH, ignoreDuplicateSlashes: true },
    trustProxy: config.trustProxy,
    // Our own shutdown hook answers in OpenAI's error shape instead.
    return503OnClosing: false,
    // Requests refused before routing, in OpenAI's error shape too.
    clientErrorHandler: answerClientError,
    frameworkErrors: (err, request, reply) => {
      // No route's hooks or response listeners run for these: counted and logged here as any request is.
      countRequest(metrics, request, reply, BEFORE_ROUTING);
      reply.raw.once('finish', () => requestLog.requestCompleted(null, request, reply));
      return answerFrameworkError(err, request, reply);
    },
    // An HTTPS server takes Node's HTTP options among its TLS ones.
    ...(tls && { https: { ...http, ...tls } }),
    // Typed by the logger given, pino's Logger, which Fastify's default instance type (FastifyBaseLogger) does not take as it is.
  }) as unknown as FastifyInstance;

  app.register(errors, { metrics });
  app.register(requestIds);
  app.register(connections, {
    sendTimeoutSeconds: config.sendTimeoutSeconds,
    sendMinRate: config.sendMinRate,
    maxConnections: config.maxConnections,
    onDropped: () => metrics.connectionDropped(),
  });
  // UPLOAD_MEMORY: request bodies held in memory, JSON (content.ts) and forms (edits.ts) together; each
  // key gets room for the largest body one request may send.
  const bodyMemory = ByteBudget.perClient(config.uploadMemory, Math.max(config.bodyLimit, LARGEST_FORM_BYTES));
  app.register(content, { memory: bodyMemory });
  // Before the plugins whose hooks reject requests, so that those are counted too.
  app.register(metricsRoutes, { metrics, public: config.metricsPublic });
  app.register(shutdown, { timeoutMs: config.shutdownTimeoutSeconds * 1000 });
  // Before auth: a request that is not even valid HTTP is told so, whatever its key.
  app.register(hostCheck);
  app.register(expectContinue);
  // Before auth: preflights are answered without a key, and refusals of a key can be read by the page.
  app.register(cors, { origins: config.corsOrigins });
  app.register(unrouted);
  app.register(auth, { apiKeys: config.apiKeys, apiKeysFile: config.apiKeysFile, corsOrigins: config.corsOrigins });
  app.register(health, { engine, registry, store });
  app.register(models, { registry, defaultModel: config.defaultModel });
  app.register(files, { store });
  // The page loads without a key (its routes are public); the API calls it makes need one like any client's.
  if (config.playground) {
    const imageOrigins = [config.publicBaseUrl && new URL(config.publicBaseUrl).origin, store.urlOrigin].filter((origin): origin is string => Boolean(origin));
    app.register(playground, { imageOrigins: [...new Set(imageOrigins)] });
  }
  // ANSWER_MEMORY: answers their clients have not read yet (answer-memory.ts); each key half of it, no
  // room kept for a lone answer: a request sets aside at most a key's share, so a lone one always fits.
  const answerMemory = ByteBudget.perClient(config.answerMemory, 0);
  metrics.watchMemory({ upload: () => bodyMemory.held, answer: () => answerMemory.held });
  // One service and one set of key rates for the three image routes: an edit counts against the same limits.
  const imageRoutes = {
    service: createImageService({ registry, engine, store, defaultRng: config.rng, defaultModel: config.defaultModel }),
    publicBaseUrl: config.publicBaseUrl,
    logPrompts: config.logPrompts,
    defaultModel: config.defaultModel,
    streamKeepAliveMs: config.streamKeepAliveSeconds * 1000,
    rates,
    slots,
    answerMemory,
    answerWaitMs: config.queueTimeoutSeconds * 1000,
  };
  app.register(images, imageRoutes);
  app.register(edits, { ...imageRoutes, memory: bodyMemory });
  return app;
}
