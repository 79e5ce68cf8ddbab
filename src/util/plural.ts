/** "1 image", "3 images": a count and its noun, in the plural unless the count is one. */
export const plural = (n: number, noun: string): string => `${n} ${noun}${n === 1 ? '' : 's'}`;
