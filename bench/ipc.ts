import { fork } from 'node:child_process';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import { median, timed } from './stats.js';

/**
 * What handing a batch's encoded images from a worker process to the server costs: the same channel
 * the pool uses (fork with `advanced` serialization, structured clone), a child that holds the bytes
 * and sends them as a worker's 'done' message when asked. The cost of the bytes is the round trip of
 * that message less the round trip of an empty one.
 */

type ToChild = { type: 'hold'; images: Uint8Array[] } | { type: 'send' } | { type: 'ping' };

if (process.argv[2] === '--ipc-child') {
  let held: Uint8Array[] = [];
  process.on('message', (message: ToChild) => {
    if (message.type === 'hold') held = message.images;
    process.send!(message.type === 'send' ? { type: 'done', images: held.map((data, seed) => ({ data, contentType: 'image/png', seed })) } : { type: 'ok' });
  });
}

/** Median milliseconds to carry `images` from a child process to this one, over `rounds` rounds. */
export async function ipcTransferMs(images: Uint8Array[], rounds = 9): Promise<number> {
  const child = fork(fileURLToPath(import.meta.url), ['--ipc-child'], { execArgv: ['--import', 'tsx'], serialization: 'advanced' });
  const ask = async (message: ToChild) => {
    const answer = once(child, 'message');
    child.send(message);
    await answer;
  };
  try {
    await ask({ type: 'hold', images });
    await ask({ type: 'send' });
    const full: number[] = [];
    const empty: number[] = [];
    for (let i = 0; i < rounds; i++) {
      full.push(await timed(() => ask({ type: 'send' })));
      empty.push(await timed(() => ask({ type: 'ping' })));
    }
    return Math.max(0, median(full) - median(empty));
  } finally {
    child.kill();
  }
}
