/**
 * How a script of ours runs `npm run <script>` on every system. With the npm that runs this process where
 * npm started it (npm_execpath, its JavaScript entry: set for every npm script, the prestart included),
 * by node itself. Else `npm` from PATH: on Windows through the shell, where npm is npm.cmd, which
 * child_process does not start by the name `npm` (ENOENT; a .cmd named in full is refused with EINVAL
 * since Node 20.12.2, CVE-2024-27980), so `npm start` failed on a tree not built yet. Plain JavaScript:
 * it runs before anything is built.
 */
export function npmRun(script, platform = process.platform, env = process.env) {
  const npmExecPath = env.npm_execpath;
  if (npmExecPath && /\.[cm]?js$/.test(npmExecPath)) return { command: process.execPath, args: [npmExecPath, 'run', script], shell: false };
  // One command line, no arguments: the shell parses it (the script's name is ours, never a user's).
  if (platform === 'win32') return { command: `npm run ${script}`, args: [], shell: true };
  return { command: 'npm', args: ['run', script], shell: false };
}
