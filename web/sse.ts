/**
 * Server-sent events read from a fetch body. EventSource cannot POST or send an Authorization header,
 * and the openai SDK would add ten times this page's size, so the page reads the frames itself: lines
 * of `field: value`, a blank line ending each event (the WHATWG rules, without reconnection and lone CR
 * line ends, which this server never writes).
 */

export interface ServerEvent {
  /** The `event:` field; "message" when absent. */
  event: string;
  data: string;
}

export async function* readEvents(body: ReadableStream<Uint8Array>): AsyncGenerator<ServerEvent> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffered = '';
  let event = '';
  let data: string[] = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      const text = decoder.decode(value, { stream: true });
      buffered += text;
      // Most chunks of a streamed image are the middle of its one long data line: split only once a line
      // ends, not the whole growing line again at every chunk.
      if (!text.includes('\n')) continue;
      // A frame may end in the middle of a line: keep the unfinished last line for the next chunk.
      const lines = buffered.split(/\r?\n/);
      buffered = lines.pop() ?? '';
      for (const line of lines) {
        if (line === '') {
          if (data.length > 0) yield { event: event || 'message', data: data.join('\n') };
          [event, data] = ['', []];
          continue;
        }
        if (line.startsWith(':')) continue;
        const colon = line.indexOf(':');
        const field = colon < 0 ? line : line.slice(0, colon);
        const text = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
        if (field === 'event') event = text;
        else if (field === 'data') data.push(text);
      }
    }
  } finally {
    reader.releaseLock();
  }
}
