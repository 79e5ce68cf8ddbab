import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createServer, type IncomingMessage } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { describe, expect, it } from 'vitest';
import { PROJECT_ROOT } from './helpers/cli.js';

/**
 * `npm run install:cuda`, the README's one command for the CUDA provider's libraries, as npm runs it:
 * with the project's .npmrc (which skips onnxruntime-node's download at `npm ci`) and npm's own
 * environment. Nothing is downloaded here: onnxruntime-node's script reaches NuGet through the proxy
 * global-agent reads from GLOBAL_AGENT_HTTP_PROXY, a server of the test's that records where the script
 * asks to go and refuses it.
 */

describe.skipIf(process.platform === 'win32')('npm run install:cuda (skipped on Windows: the script is written for a POSIX shell, as the README says)', () => {
  it('fetches the CUDA provider from NuGet, rather than exiting 0 having installed nothing', async () => {
    const asked: string[] = [];
    const proxy = createServer((_request, response) => response.writeHead(403).end());
    proxy.on('connect', (request: IncomingMessage, socket: Socket) => {
      asked.push(request.url ?? '');
      socket.end('HTTP/1.1 403 Forbidden\r\n\r\n');
    });
    proxy.listen(0, '127.0.0.1');
    await once(proxy, 'listening');
    try {
      const { port } = proxy.address() as AddressInfo;
      const child = spawn('npm', ['run', '--silent', 'install:cuda'], {
        cwd: PROJECT_ROOT,
        env: { ...process.env, GLOBAL_AGENT_HTTP_PROXY: `http://127.0.0.1:${port}` },
        stdio: 'ignore',
      });
      const [code] = (await once(child, 'exit')) as [number | null];
      // ONNXRUNTIME_NODE_INSTALL=cuda12 made onnxruntime-node 1.30's script read no flag at all, and one
      // run by npm inside its own project (npm_package_json's folder) then exits 0 at once.
      expect(asked).toEqual(['api.nuget.org:443']);
      // The proxy refused it: the script fails, as it does wherever NuGet cannot be reached.
      expect(code).not.toBe(0);
    } finally {
      proxy.close();
    }
  });
});
