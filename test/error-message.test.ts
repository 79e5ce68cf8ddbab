import net from 'node:net';
import { describe, expect, it } from 'vitest';
import { firstLineOf, messageOf } from '../src/util/error-message.js';

/** The error of a connection refused at each of two addresses of one name (Redis at localhost, down, where it is 127.0.0.1 and ::1). */
function refusedAtTwoAddresses(): Promise<unknown> {
  return new Promise((resolve) => {
    const addresses = [
      { address: '127.0.0.1', family: 4 },
      { address: '::1', family: 6 },
    ];
    const socket = net.connect({ host: 'redis.test', port: 1, autoSelectFamily: true, lookup: (_host, _options, callback) => callback(null, addresses) });
    socket.on('error', resolve);
  });
}

describe('messageOf', () => {
  it("says what was thrown, whether an Error or not (a string or an object read 'undefined' before)", () => {
    expect(messageOf(new RangeError('too far'))).toBe('too far');
    expect(messageOf('the session is closed')).toBe('the session is closed');
    expect(messageOf({ code: 7 })).toBe('{ code: 7 }');
    expect(messageOf(undefined)).toBe('undefined');
    // onnxruntime's messages go on with source locations after their first line.
    expect(firstLineOf(new Error('Load model failed\n/onnxruntime_src/core/graph.cc:12 Graph()'))).toBe('Load model failed');
  });

  it("says each address's reason when a connection to a name with several failed (Node's AggregateError, whose message is empty)", async () => {
    const err = await refusedAtTwoAddresses();
    expect(err).toBeInstanceOf(AggregateError);
    // Before, '': "Redis at redis://localhost:6379 cannot be reached ()".
    expect(messageOf(err)).toMatch(/^connect E[A-Z]+ (127\.0\.0\.1|::1):1; connect E[A-Z]+ (127\.0\.0\.1|::1):1$/);
    expect(messageOf(err)).toContain('127.0.0.1:1');
  });
});
