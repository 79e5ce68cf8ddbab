/**
 * Encoder settings by measurement: time, size and error of each candidate PNG/WebP/JPEG setting on
 * 1024x1024 pictures (see pictures.ts), against sharp's defaults (what the server used before). The
 * chosen settings are encode-image.ts's ENCODER_SETTINGS; `npm run bench` keeps the chosen-vs-default
 * rows, this prints the whole grid behind the choice.
 *
 *   npx tsx bench/encoders.ts
 */
import sharp, { type Sharp } from 'sharp';
import { fileURLToPath } from 'node:url';
import { ENCODER_SETTINGS, encodeImage } from '../src/pipelines/encode-image.js';
import type { OutputFormat, RgbImage } from '../src/runtime/types.js';
import { bufferView } from '../src/util/bytes.js';
import { pictures, type Picture } from './pictures.js';
import type { Row } from './report.js';
import { ms, sideBySide } from './stats.js';

type Encode = (image: Sharp) => Sharp;

/** sharp's defaults at OpenAI's default quality (100): the encoder settings before this measurement. */
const DEFAULTS: Record<OutputFormat, Encode> = {
  png: (s) => s.png(),
  webp: (s) => s.webp({ quality: 100 }),
  jpeg: (s) => s.jpeg({ quality: 100 }),
};

const GRID: [string, Encode][] = [
  ...[6, 4, 3, 2, 1].flatMap((compressionLevel) =>
    [false, true].map((adaptiveFiltering): [string, Encode] => [`png level ${compressionLevel}${adaptiveFiltering ? ' filtered' : ''}`, (s) => s.png({ compressionLevel, adaptiveFiltering })]),
  ),
  ...[4, 3, 2, 1, 0].map((effort): [string, Encode] => [`webp q100 effort ${effort}`, (s) => s.webp({ quality: 100, effort })]),
  ...[4, 2, 0].map((effort): [string, Encode] => [`webp q80 effort ${effort}`, (s) => s.webp({ quality: 80, effort })]),
  ['jpeg q100', (s) => s.jpeg({ quality: 100 })],
  ['jpeg q100 mozjpeg', (s) => s.jpeg({ quality: 100, mozjpeg: true })],
  ['jpeg q100 4:4:4', (s) => s.jpeg({ quality: 100, chromaSubsampling: '4:4:4' })],
];

const raw = ({ pixels, width, height }: RgbImage) => sharp(bufferView(pixels), { raw: { width, height, channels: 3 } });

interface Outcome {
  ms: number;
  bytes: number;
  meanError: number;
  maxError: number;
}

async function outcome(image: RgbImage, encode: () => Promise<Uint8Array>): Promise<Outcome> {
  await encode();
  let file: Uint8Array = new Uint8Array();
  const [time] = await sideBySide([async () => (file = await encode())], 5);
  const back = await sharp(file).removeAlpha().raw().toBuffer();
  let sum = 0;
  let max = 0;
  for (let i = 0; i < back.length; i++) {
    const d = Math.abs(back[i] - image.pixels[i]);
    sum += d;
    max = Math.max(max, d);
  }
  return { ms: time, bytes: file.length, meanError: sum / back.length, maxError: max };
}

const kib = (bytes: number) => `${(bytes / 1024).toFixed(0)} KiB`;

/** The suite's rows: each format's chosen settings against sharp's defaults, on each picture. */
export async function measureEncoders(list: readonly Picture[]): Promise<Row[]> {
  const rows: Row[] = [];
  for (const { name, image } of list) {
    for (const format of Object.keys(DEFAULTS) as OutputFormat[]) {
      const before = await outcome(image, async () => (await DEFAULTS[format](raw(image)).toBuffer()) as Uint8Array);
      const after = await outcome(image, () => encodeImage(image, format));
      rows.push({
        group: 'encode (chosen/default)',
        case: `${format} q100 ${name}: ${kib(before.bytes)} -> ${kib(after.bytes)}`,
        baseline: ms(before.ms),
        measured: ms(after.ms),
        ratio: after.ms / before.ms,
      });
    }
  }
  return rows;
}

async function printGrid(): Promise<void> {
  const { pictures: list, skipped } = await pictures();
  if (skipped) console.log(`skipped: ${skipped}`);
  console.log(`chosen: ${JSON.stringify(ENCODER_SETTINGS)}`);
  for (const { name, image } of list) {
    console.log(`\n${name}, 1024x1024             time      size   mean err  max err`);
    for (const [label, encode] of GRID) {
      const o = await outcome(image, async () => (await encode(raw(image)).toBuffer()) as Uint8Array);
      console.log(`  ${label.padEnd(26)} ${ms(o.ms).padStart(8)} ${kib(o.bytes).padStart(9)} ${o.meanError.toFixed(2).padStart(8)} ${String(o.maxError).padStart(7)}`);
    }
  }
}

if (process.argv[1] === fileURLToPath(import.meta.url)) await printGrid();
