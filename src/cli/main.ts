#!/usr/bin/env node
import { readFileSync } from 'node:fs';
import { Command } from 'commander';
import { pino } from 'pino';
import { ConfigError, loadConfig, settingsHelp, type SettingName } from '../config.js';
import { startServer } from '../server.js';
import { registerGenerateCommand } from './generate.js';
import { registerModelCommands } from './models.js';

/** The `imagegen` command. `serve` is what `npm start` runs. */

const { version } = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string };

const program = new Command('imagegen').description('Self-hosted OpenAI-compatible image generation (POST /v1/images/generations)').version(version);

const serve = program
  .command('serve')
  .description('start the HTTP server; every flag can also be set by the environment variable shown')
  .action(async (flags: Partial<Record<SettingName, string>>) => {
    let config;
    try {
      config = loadConfig(flags);
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err;
      console.error(err.message);
      process.exit(2);
    }
    // Keys are never logged, prompts only with LOG_PROMPTS: request logs carry method, URL, status, ids and timings.
    const logger = pino({ level: config.logLevel });
    const server = await startServer(config, logger);

    let stopping = false;
    const stop = (signal: NodeJS.Signals) => {
      if (stopping) {
        logger.warn(`${signal} again: exiting without waiting for running requests`);
        process.exit(1);
      }
      stopping = true;
      logger.info(`${signal}: finishing running requests, then exiting (send it again to exit at once)`);
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

for (const setting of settingsHelp) serve.option(`${setting.flag} <value>`, `${setting.description} [${setting.env}]`);

registerGenerateCommand(program);
registerModelCommands(program);

await program.parseAsync();
