/**
 * The scheduler registry: picks a sampler by scheduler_config.json's `_class_name` or by a public name
 * a request asks for. Adding a scheduler = its own file exporting a SchedulerEntry + one line in
 * ENTRIES. A list rather than a scan of the folder at load (which would make it one file): the API's
 * wire types validate `scheduler` against these names, and the browser playground's type-check, tsc and
 * the layer test all follow this import graph, which a scan would hide from them.
 */
import { ddim } from './ddim.js';
import { dpmSolverMultistep } from './dpm-solver-multistep.js';
import { eulerAncestral } from './euler-ancestral.js';
import { euler } from './euler.js';
import { flowMatchEuler } from './flow-match-euler.js';
import { lcm } from './lcm.js';
import { withDefaults } from './noise-schedule.js';
import { pndm } from './pndm.js';
import type { ModelKind, Scheduler, SchedulerConfig } from './scheduler.js';
import { scheduleStrength, strengthStart, type StrengthRule } from './strength.js';

export type { ModelKind, Scheduler, SchedulerConfig } from './scheduler.js';
export { fewestSteps, honoursStrength, scheduleStrength, stepsRun, strengthStart, type StrengthRule } from './strength.js';

/** What a scheduler file registers. */
export interface SchedulerEntry {
  /** diffusers' class name, as in scheduler_config.json's `_class_name`. */
  className: string;
  kind: ModelKind;
  /** Public names, each with the config fields that define it (e.g. Karras sigmas on or off). */
  names: Record<string, SchedulerConfig>;
  create(config: SchedulerConfig): Scheduler;
  /**
   * What a config of this class asks for that the class here does not run (`why`), and the name that
   * stands in for it (standInFor); undefined when it runs the config as it is.
   */
  unrun?(config: SchedulerConfig): { why: string; by: string } | undefined;
}

const ENTRIES: readonly SchedulerEntry[] = [pndm, ddim, euler, eulerAncestral, dpmSolverMultistep, lcm, flowMatchEuler];

/** Public scheduler names, for API validation and docs. */
export const SCHEDULER_NAMES: readonly string[] = ENTRIES.flatMap((e) => Object.keys(e.names));

export function schedulersFor(kind: ModelKind): string[] {
  return ENTRIES.filter((e) => e.kind === kind).flatMap((e) => Object.keys(e.names));
}

/** A step count every scheduler runs (PNDM's Runge-Kutta warm-up needs 4), for checking a config at load. */
export const SCHEDULE_CHECK_STEPS = 4;

/** A scheduler of a model's kind whose class refuses the model's scheduler config, and the class's own reason. */
export interface SchedulerRefusal {
  name: string;
  reason: string;
}

/** The schedulers of a model's kind, split by whether they run its scheduler config (schedulersRunning). */
export interface SchedulerOffer {
  running: string[];
  refused: SchedulerRefusal[];
}

/**
 * The schedulers of `kind` that run a model with this scheduler config, so that a model lists, and a
 * client is offered, only what it runs; and the others with the reason their class refuses the config
 * (PNDM a zero-SNR schedule, DDIM and LCM one whose first step an epsilon model cannot denoise), so that
 * the log, `models list` and a request naming one say why it is missing rather than leave it to a guess,
 * and a scheduler that throws for another reason (a bug) shows its error there too.
 */
export function schedulersRunning(config: SchedulerConfig, kind: ModelKind): SchedulerOffer {
  const running: string[] = [];
  const refused: SchedulerRefusal[] = [];
  for (const name of schedulersFor(kind)) {
    try {
      checkSchedule(config, name, SCHEDULE_CHECK_STEPS);
      running.push(name);
    } catch (err) {
      // Not util's messageOf: the playground's build compiles this module, and that one reads node:util.
      refused.push({ name, reason: err instanceof Error ? err.message : String(err) });
    }
  }
  return { running, refused };
}

/** What an operator is told of a model's refused schedulers (the scan's log, `models list`); undefined when there are none. */
export function refusalNote(refused: readonly SchedulerRefusal[]): string | undefined {
  if (refused.length === 0) return undefined;
  return `schedulers not offered, as its scheduler_config.json does not run on them: ${refused.map(({ name, reason }) => `${name} (${reason})`).join('; ')}`;
}

function supportedList(): string {
  return `supported schedulers: ${SCHEDULER_NAMES.join(', ')}; scheduler classes: ${ENTRIES.map((e) => e.className).join(', ')}`;
}

/** The entry of the class a config names, if this server runs it. */
const knownClass = (config: SchedulerConfig): SchedulerEntry | undefined => ENTRIES.find((e) => e.className === config._class_name);

function entryForClass(config: SchedulerConfig): SchedulerEntry {
  const entry = knownClass(config);
  if (!entry) throw new Error(`unknown scheduler class "${String(config._class_name)}"; ${supportedList()}`);
  return entry;
}

function entryForName(name: string): SchedulerEntry {
  const entry = ENTRIES.find((e) => Object.hasOwn(e.names, name));
  if (!entry) throw new Error(`unknown scheduler "${name}"; ${supportedList()}`);
  return entry;
}

/**
 * The scheduler for a model's scheduler_config.json, or the one a request names. An override keeps
 * what the config says (betas, prediction_type, spacing, steps_offset ...) and takes its own class's
 * defaults for what it does not say, as diffusers' `from_config` does since 0.18 (a key the old class
 * only defaulted is left to the new one: SD 1.5's file names no timestep_spacing, so Euler over it
 * spaces by `linspace`, its own default, not PNDM's `leading`); then the fields the chosen name fixes.
 */
export function createScheduler(config: SchedulerConfig, override?: string): Scheduler {
  if (override === undefined) return entryForClass(config).create(config);

  const target = entryForName(override);
  const source = config._class_name === undefined ? undefined : entryForClass(config);
  if (source && source.kind !== target.kind) {
    throw new Error(
      `scheduler "${override}" does not fit a ${source.kind} model (${source.className}); use one of: ${schedulersFor(source.kind).join(', ')}`,
    );
  }
  return target.create(switchedConfig(config, override));
}

/** `config` for the scheduler named `name`, as diffusers' from_config makes it: what the file says, then the fields the name fixes (the new class fills in the rest). */
function switchedConfig(config: SchedulerConfig, name: string): SchedulerConfig {
  const target = entryForName(name);
  const inherited = withDefaults({}, config);
  // DDIM's constructor default clips x0 to [-1, 1], which suits pixel-space models only; latent models
  // whose config never mentions clipping (Euler configs do not) must not be clipped by an override.
  const clipSample = config.clip_sample ?? false;
  return { ...inherited, clip_sample: clipSample, ...target.names[name], _class_name: target.className };
}

/** The classes this server runs for `kind`, in a sentence. */
function classesOf(kind: ModelKind): string {
  const names = ENTRIES.filter((e) => e.kind === kind).map((e) => e.className);
  return names.length === 1 ? names[0] : `one of ${names.join(', ')}`;
}

/** A kind of model in a sentence. */
const KIND_WORDS: Record<ModelKind, string> = { vp: 'noise-prediction (Stable Diffusion)', flow: 'flow-matching (FLUX)' };

/** What stands in for a scheduler class this server does not run, by the kind of model. */
const STAND_INS: Record<ModelKind, string> = { vp: 'euler', flow: 'flow_match_euler' };

/** The scheduler that runs for a model's own config, and what of that config (`why`: its class, by default) this server does not run. */
export interface StandIn {
  name: string;
  config: SchedulerConfig;
  why?: string;
}

/**
 * For a config whose class this server does not run (UniPC, DEIS, Heun, DDPM ... in a model's own
 * scheduler_config.json), or runs without some of its settings (DPM-Solver's SDE variants), the config
 * of the scheduler that stands in for it, keeping its training fields (betas, prediction type, spacing)
 * as a request's `scheduler` override would; undefined when it runs as it is. diffusers would run the
 * model with its own sampler; refusing the whole model for the sampler it happened to ship with would
 * leave it unusable here. So too DPM-Solver on a FLUX model's flow-matching sigmas (use_flow_sigmas).
 * Throws for a class trained on other noise levels than DDPM's betas (EDM), which nothing here can stand
 * in for, and for a class this server runs for the other kind of model (Euler's noise-prediction sigmas
 * on FLUX, flow matching on Stable Diffusion), which would draw noise.
 */
export function standInFor(config: SchedulerConfig, kind: ModelKind): StandIn | undefined {
  const known = knownClass(config);
  if (known?.kind === kind) {
    const unrun = known.unrun?.(config);
    return unrun && { name: unrun.by, config: switchedConfig(config, unrun.by), why: unrun.why };
  }
  if (known) {
    // DPM-Solver samples a FLUX model on flow-matching sigmas under use_flow_sigmas (as UniPC does), which
    // diffusers' FluxPipeline lets it; its class here runs noise-prediction sigmas only.
    if (kind === 'flow' && config.use_flow_sigmas === true) return { name: STAND_INS.flow, config: switchedConfig(config, STAND_INS.flow), why: 'use_flow_sigmas' };
    // Any other class of the other kind would draw noise in silence: noise-prediction sigmas on a flow
    // transformer, or flow matching on a UNet (diffusers' pipelines fail on them).
    throw new Error(
      `${known.className} schedules ${KIND_WORDS[known.kind]} models, and this model is a ${KIND_WORDS[kind]} one: ` +
        `give it its base model's scheduler_config.json, whose _class_name is ${classesOf(kind)}`,
    );
  }
  // EDM's classes (Playground v2.5's) sample noise levels of their own (sigma_min..sigma_max around
  // sigma_data) rather than the DDPM betas every scheduler here reads: a stand-in would draw another
  // picture in silence.
  if (config.sigma_data !== undefined) {
    throw new Error(
      `${String(config._class_name)} samples EDM noise levels (sigma_data ${String(config.sigma_data)}), not a DDPM beta schedule, and no scheduler this server runs can stand in for it: such models (e.g. Playground v2.5) are not supported`,
    );
  }
  const name = STAND_INS[kind];
  return { name, config: switchedConfig(config, name) };
}

/**
 * Throws the scheduler's own error when it cannot run `steps` steps for this config (LCM stops at
 * original_inference_steps, or what a `strength` it reads leaves of them; PNDM's Runge-Kutta warm-up
 * needs 4), so callers can refuse a request before it reaches a worker. mu does not change which step
 * counts are valid.
 */
export function checkSchedule(config: SchedulerConfig, override: string | undefined, steps: number, strength?: number): void {
  createScheduler(config, override).setTimesteps(steps, { mu: 1, strength });
}

/**
 * The denoiser passes a batch of `steps` makes, from where its `strength` starts it (strengthStart), as
 * the denoising loop runs them: one per step, plus the one PNDM repeats (diffusers' progress bar counts
 * it too), which the steps alone do not tell.
 */
export function passesRun(config: SchedulerConfig, override: string | undefined, steps: number, strength: number | undefined, rule: StrengthRule): number {
  const scheduler = createScheduler(config, override);
  scheduler.setTimesteps(steps, { mu: 1, strength: scheduleStrength(rule, strength) });
  return scheduler.timesteps.length - (strength === undefined ? 0 : strengthStart(steps, strength, rule));
}
