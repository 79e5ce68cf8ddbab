#!/usr/bin/env node
import { readFileSync } from 'node:fs';
import { Command } from 'commander';
import { givenSettings, loadConfig, settingsHelp, type Config, type SettingName } from '../config.js';
import { ConfigError } from '../util/config-error.js';
import { registerGenerateCommand } from './generate.js';
import { registerModelCommands } from './models.js';
import { messageOf } from '../util/error-message.js';

/** The `imagegen` command. `serve` is what `npm start` runs. */

const { version } = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string };

const program = new Command('imagegen')
  .description('Self-hosted OpenAI-compatible image generation (POST /v1/images/generations)')
  .version(version)
  // Every usage error (an unknown flag, a missing argument or option, no command) exits 2, as an invalid
  // setting does, so that scripts can tell it from a failure of the work (1); help and --version exit 0.
  // Set before the commands are made: each inherits it.
  .exitOverride((err) => process.exit(err.exitCode === 0 ? 0 : 2));

const serve = program
  .command('serve')
  .description('start the HTTP server; every flag can also be set by the environment variable shown')
  .action(async (flags: Partial<Record<SettingName, string | true>>) => {
    let config;
    const given: Partial<Record<SettingName, string>> = Object.fromEntries(Object.entries(flags).map(([name, value]) => [name, value === true ? 'true' : value]));
    try {
      config = loadConfig(given);
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err;
      refuseSettings(err);
    }
    // Loaded here, not at the top: the other commands (and every usage error) start without the server's modules.
    const [{ createLogger }, { startServer }] = await Promise.all([import('../observability/logger.js'), import('../server.js')]);
    // Keys are never logged, prompts only with LOG_PROMPTS: request logs carry method, URL, status, ids and timings.
    const logger = createLogger(config.logLevel);
    const server = await startServer(config, logger).catch((err: unknown) => {
      // A setting found wrong only as the server starts (the S3 store's region): refused as the others are.
      if (err instanceof ConfigError) refuseSettings(err);
      const known = startupProblem(err as NodeJS.ErrnoException, config);
      // A problem the message explains needs no stack trace in the log; anything else does.
      if (!known) logger.fatal({ err }, 'cannot start');
      console.error(`imagegen serve cannot start: ${known ?? messageOf(err)}`);
      process.exit(1);
    });
    // Once started: a start refused for a bad file or setting logs nothing but why.
    logger.info({ settings: givenSettings(given) }, 'settings given (the others are at their defaults: imagegen serve --help lists them)');

    /** The first stop signal and when it came. */
    let stopping: { signal: NodeJS.Signals; since: number } | undefined;
    const stop = (signal: NodeJS.Signals) => {
      if (stopping) {
        // One signal delivered twice: GNU timeout, and kill of the process group, send it to the server
        // and then to its group, the server included; a person sends it again later than this.
        if (performance.now() - stopping.since < REPEATED_SIGNAL_MS) return;
        logger.warn(`${signal === stopping.signal ? `${signal} again` : `${signal} after ${stopping.signal}`}: exiting without waiting for running requests`);
        process.exit(1);
      }
      stopping = { signal, since: performance.now() };
      logger.info(`${signal}: finishing running requests, then exiting (send it again, a second or more after this one, to exit at once)`);
      server.close().then(
        () => process.exit(0),
        (err) => {
          logger.error({ err }, 'shutdown failed');
          process.exit(1);
        },
      );
    };
    process.on('SIGTERM', stop);
    process.on('SIGINT', stop);
  });

/** A second stop signal sooner than this after the first is the same one delivered twice (see serve's stop), not a request to exit at once. */
const REPEATED_SIGNAL_MS = 1000;

/** Settings refused, as they are read or as the server starts: their problems, and exit 2 as for any usage error. */
function refuseSettings(err: ConfigError): never {
  console.error(err.message);
  process.exit(2);
}

/** What stopped the server from starting, in words that name the setting to change; undefined for what it cannot explain. */
function startupProblem(err: NodeJS.ErrnoException, config: Config): string | undefined {
  const file = err.path ?? '';
  switch (err.code) {
    case 'EADDRINUSE':
      return `port ${config.port} on ${config.host} is already in use (another imagegen, or another program): stop it, or set PORT to a free port.`;
    case 'EACCES':
      if (err.syscall === 'listen') return `not allowed to listen on port ${config.port}: set PORT to one above 1023, or give node the capability to bind low ports.`;
      return `no permission to use ${file}: check the setting naming it (DATA_DIR, MODELS_DIR, TLS_CERT, TLS_KEY, API_KEYS_FILE) and the folder's owner.`;
    case 'ENOTFOUND':
    case 'EADDRNOTAVAIL':
      return `HOST '${config.host}' is not an address of this machine: set HOST to 127.0.0.1, 0.0.0.0 (with API_KEYS) or one of its own addresses.`;
    case 'ENOENT':
      return `${file} does not exist: check the setting naming it (TLS_CERT, TLS_KEY, API_KEYS_FILE, DATA_DIR, MODELS_DIR).`;
    case 'ENOTDIR':
    case 'EROFS':
    case 'EEXIST':
    case 'EPERM':
      return `${file} cannot be used as a writable folder (${err.code}): set DATA_DIR to a folder the server may write.`;
    // The image store's folder is what a server makes as it starts: Node's own words named no setting.
    case 'ENOSPC':
    case 'EDQUOT':
      return `${file} cannot be made: its disk is full (${err.code}): free space on it, or set DATA_DIR to a folder on a disk with room.`;
    default:
      // OpenSSL's errors (a file that is no PEM, a key that does not match the certificate) name neither file.
      if (err.code?.startsWith('ERR_OSSL')) {
        return `TLS_CERT (${config.tlsCert}) and TLS_KEY (${config.tlsKey}) cannot be used: ${err.message}. They must be the PEM certificate (chain) and its private key.`;
      }
      // Errors of ours that already say what to do (a bad API_KEYS_FILE, TLS_CERT or TLS_KEY, an unusable store).
      if (['KeyFileError', 'TlsFileError', 'StoreUnavailableError'].includes(err.name)) return err.message;
      return undefined;
  }
}

for (const setting of settingsHelp) {
  // The default goes in the text, not commander's default: that would set every flag and hide the environment.
  const help = `${setting.description} [${setting.env}${setting.defaultText === undefined ? '' : `, default ${setting.defaultText}`}]`;
  // A switch's flag alone is true (commander then gives true, which loadConfig reads as the text 'true').
  if (setting.isSwitch) serve.option(`${setting.flag} [true|false]`, help, (value: string) => value);
  else serve.option(`${setting.flag} <value>`, help);
}

registerGenerateCommand(program);
registerModelCommands(program);

await program.parseAsync();
