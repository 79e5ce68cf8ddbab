import { createHmac } from 'node:crypto';

/**
 * Whose an image is: the id of the API key whose request made it, which its name carries (image-names.ts)
 * so that every replica and restart counts each key's share of the store alike (space.ts).
 */

/** 64 bits: no two keys of a server share an owner, and the name stays short. */
export const OWNER_DIGITS = 16;
const OWNER = new RegExp(`^[0-9a-f]{${OWNER_DIGITS}}$`);

/**
 * The owner id of an API key's images: an HMAC of a fixed text keyed by the key itself, its first 64
 * bits in hex. Every replica and restart reads the same keys, so they all work out the same id with no
 * secret or table of their own to share, and nothing else can: the id is in each image's file or object
 * name, which S3 presigned URLs show, and the key's label there (a person's or team's name, or the start
 * of the key's SHA-256) would tell anyone given an image link who made it, and which other links are
 * the same client's. Keyed by the key, the id tells that much only (links of one key share it): telling
 * the key from it means guessing keys and checking each offline, which only a short or guessable key
 * falls to (docs/security.md: keys are long random strings). A random id per key would leak nothing,
 * but replicas would need a table shared among them to agree on it. A key rotated in is a new owner: the
 * old key's images count against the old id until they expire.
 */
export function imageOwner(apiKey: string): string {
  return createHmac('sha256', apiKey).update('imagegen image owner').digest('hex').slice(0, OWNER_DIGITS);
}

/**
 * `owner`, checked to be one an image name can carry (an imageOwner id), as a reservation takes it: the
 * puts made with it name their images so. Throws for anything else.
 */
export function nameableOwner(owner: string | undefined): string | undefined {
  if (owner !== undefined && !OWNER.test(owner)) throw new TypeError(`an image's owner is an imageOwner id (${OWNER_DIGITS} hex digits), not '${owner}'`);
  return owner;
}
