/**
 * The RGB values of the pixels of a picture (8-bit RGB, `width` pixels a row) where `inside(x, y)`
 * holds, in order: two pictures' same region, to compare with difference() (src/util/difference.ts).
 */
export function regionOf(rgb: ArrayLike<number>, width: number, inside: (x: number, y: number) => boolean): number[] {
  const values: number[] = [];
  for (let p = 0; p * 3 < rgb.length; p++) {
    if (inside(p % width, Math.floor(p / width))) values.push(rgb[p * 3], rgb[p * 3 + 1], rgb[p * 3 + 2]);
  }
  return values;
}
