import { quoteList } from '../api/errors.js';
import type { ModelRegistry } from '../models/registry.js';

/**
 * Why a model name runs no model: unknown, an alias (an OpenAI name) of a model that is not there, the
 * model DEFAULT_MODEL gives, or a folder installed but unusable (and why). The API's error and
 * `imagegen generate` say the same; this module loads nothing else, so the command still answers a
 * name it cannot run without onnxruntime's modules.
 */

/** Whom the words are for: a client of the server (its settings, its operator), or the one running a command here. */
export type Audience = 'server' | 'command';

export interface UnresolvedModel {
  message: string;
  /** Installed but unusable: its folder is to be repaired, not the name changed. */
  unusable: boolean;
}

export function unresolvedModel(id: string, registry: ModelRegistry, defaultModel: string | undefined, audience: Audience): UnresolvedModel {
  const available = registry.list().map((m) => m.id);
  const hint = available.length ? ` Available models: ${quoteList(available)}.` : ' No models are installed.';
  const setting = audience === 'server' ? "the server's DEFAULT_MODEL" : 'DEFAULT_MODEL';
  const repairer = audience === 'server' ? "the server's operator can repair it" : 'repair its folder, or remove it';
  const repair = registry.unusableReason(id) && `${registry.whyNone(id)}; ${repairer}`;
  // An alias (an OpenAI name) whose model is missing names that model, and the setting that chose it.
  const target = registry.aliasTarget(id);
  const what = target
    ? ` is an alias of '${target}'${target === defaultModel ? `, ${setting},` : ''} which ${repair ?? 'is not installed (see MODEL_ALIASES and DEFAULT_MODEL)'}`
    : // A request that named no model got it from DEFAULT_MODEL.
      `${id === defaultModel ? ` (${setting}, which requests without a model run)` : ''} ${repair ?? 'does not exist'}`;
  return { message: `The model '${id}'${what}.${hint}`, unusable: Boolean(repair) };
}
