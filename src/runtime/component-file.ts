import path from 'node:path';

/**
 * A component's graph file within its model's folder, as `unet/model.onnx`: what messages that reach
 * clients name (they are not told server paths), and what the log's warnings name beside the model.
 */
export const componentFile = (file: string): string => `${path.basename(path.dirname(file))}/${path.basename(file)}`;
