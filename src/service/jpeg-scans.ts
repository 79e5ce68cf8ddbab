/**
 * How many scans a JPEG holds. A progressive JPEG's decoder runs over every block of the picture once a
 * scan, and the progression JPEG allows (a scan per coefficient, per component, per bit) gives a 4096 x
 * 4096 picture of 1 MiB some 2000 scans, which libjpeg decodes in 5 s of a thread of libuv's pool (for
 * each of an edit's two decodes) where an ordinary one takes 0.1 s: a few such uploads held the pool, and
 * with it every file read of the server (an image download took 20 s). Encoders write about 10 scans.
 */

const SOI = 0xd8;
const EOI = 0xd9;
const SOS = 0xda;
/** Markers without a length: RST0-7 and TEM. */
const standalone = (marker: number) => (marker >= 0xd0 && marker <= 0xd7) || marker === 0x01;

/**
 * The scans of `jpeg`, counted up to `limit + 1` (no need to read further). The marker segments are
 * walked by their lengths, so that an EXIF thumbnail's own scans (a JPEG inside an APP1 segment) do not
 * count; a scan's data ends at the first 0xFF that is not a stuffed 0x00, a restart marker or fill. A
 * file that is no JPEG, or damaged, gives what was counted before its damage: the decoder judges it.
 */
export function jpegScans(jpeg: Buffer, limit: number): number {
  if (jpeg[0] !== 0xff || jpeg[1] !== SOI) return 0;
  let scans = 0;
  let at = 2;
  while (scans <= limit && at + 4 <= jpeg.length && jpeg[at] === 0xff) {
    const marker = jpeg[at + 1];
    if (marker === 0xff || standalone(marker)) {
      at += marker === 0xff ? 1 : 2;
      continue;
    }
    if (marker === EOI) break;
    at += 2 + jpeg.readUInt16BE(at + 2);
    if (marker !== SOS) continue;
    scans++;
    // Entropy-coded data: Buffer.indexOf finds each 0xFF natively (about one byte in 256 of it).
    for (at = jpeg.indexOf(0xff, at); at >= 0 && at + 1 < jpeg.length; at = jpeg.indexOf(0xff, at + 1)) {
      const next = jpeg[at + 1];
      if (next !== 0 && next !== 0xff && !standalone(next)) break;
    }
    if (at < 0) break;
  }
  return scans;
}
