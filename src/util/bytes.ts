/** A Buffer over the same memory as `bytes`: Buffer's methods (base64, sharp's input) without a copy. */
export function bufferView(bytes: Uint8Array): Buffer {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}
