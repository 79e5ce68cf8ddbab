/** See npm-run.mjs. */
export function npmRun(script: string, platform?: NodeJS.Platform, env?: NodeJS.ProcessEnv): { command: string; args: string[]; shell: boolean };
