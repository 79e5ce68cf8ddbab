import { PassThrough, pipeline, type Readable } from 'node:stream';

/**
 * An object's bytes as they stream from the bucket to a client, failed with a TimeoutError when the
 * bucket sends nothing for `idleMs` while they are wanted. The time the client's own pace holds them
 * back (the stream paused by backpressure) does not count: the files route lets a client stop reading
 * for SEND_TIMEOUT_SECONDS (a minute), and the SDK's socket idle limit, which counted those pauses as the
 * bucket's silence, cut such a client's download of a large image after 10 s.
 */
export function failWhenStalled(body: Readable, idleMs: number, what: string): Readable {
  const out = new PassThrough();
  let timer: NodeJS.Timeout | undefined;
  const stop = () => clearTimeout(timer);
  const start = () => {
    stop();
    timer = setTimeout(() => body.destroy(Object.assign(new Error(`${what}: the bucket sent nothing for ${idleMs} ms`), { name: 'TimeoutError' })), idleMs).unref();
  };
  // Whether the body is wanted now: a 'resume' comes a tick after resume(), by when a pause() may have
  // undone it; a 'data' is heard after the pipe's own listener, by when a chunk the reader could not
  // take has paused the body.
  const follow = () => (body.readableFlowing ? start() : stop());
  pipeline(body, out, stop);
  body.on('data', follow);
  body.on('resume', follow);
  body.on('pause', stop);
  follow();
  return out;
}
