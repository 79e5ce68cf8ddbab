/**
 * What an API key is on the wire: the token after "Bearer " in an Authorization header. One rule serves
 * the header's reader (http/auth.ts) and every place keys are configured (API_KEYS, API_KEYS_FILE), so
 * a key the configuration accepts can always be sent, and one that cannot be sent is refused at start
 * rather than locking its clients out.
 */

/**
 * Printable characters a header value can carry: ASCII and Latin-1 without control characters or white
 * space (Node refuses control characters in headers; white space would end the token).
 */
const TOKEN = '[\\x21-\\x7e\\xa1-\\xff]+';
const KEY = new RegExp(`^${TOKEN}$`);
const BEARER = new RegExp(`^Bearer[ \\t]+(${TOKEN})[ \\t]*$`, 'i');

/** Whether `key` is something a client can send as "Authorization: Bearer <key>". */
export const isSendableKey = (key: string): boolean => KEY.test(key);

/** The key of an Authorization header's Bearer credentials; undefined when there is none. */
export const bearerKey = (authorization: string | undefined): string | undefined => BEARER.exec(authorization ?? '')?.[1];
