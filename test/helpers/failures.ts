import OpenAI from 'openai';
import { expect } from 'vitest';

/** What a promise that must fail fails with; a promise that succeeds fails the test. */
export async function failureOf<E = Error>(promise: Promise<unknown>): Promise<E> {
  try {
    await promise;
  } catch (err) {
    return err as E;
  }
  throw new Error('expected it to fail');
}

type ApiErrorClass = abstract new (...args: never[]) => InstanceType<typeof OpenAI.APIError>;

/** The SDK's error of a request that must fail, checked to be of `kind` (any APIError by default). */
export async function apiError(promise: Promise<unknown>, kind: ApiErrorClass = OpenAI.APIError): Promise<InstanceType<typeof OpenAI.APIError>> {
  const err = await failureOf(promise);
  expect(err).toBeInstanceOf(kind);
  return err as InstanceType<typeof OpenAI.APIError>;
}
