import { describe, expect, it } from 'vitest';
import { messageOf } from '../src/util/error-message.js';

describe('messageOf', () => {
  it("says what was thrown, whether an Error or not (a string or an object read 'undefined' before)", () => {
    expect(messageOf(new RangeError('too far'))).toBe('too far');
    expect(messageOf('the session is closed')).toBe('the session is closed');
    expect(messageOf({ code: 7 })).toBe('{ code: 7 }');
    expect(messageOf(undefined)).toBe('undefined');
  });
});
