/**
 * The edit's picture and the mask painted over it. The canvas has the picture's own pixel size (the
 * server wants a mask of exactly that size) and is scaled by CSS; a stroke paints where the image is
 * redrawn. The mask sent is OpenAI's kind: opaque where the picture is kept, transparent where painted.
 */

/** Opaque, so a stroke is fully transparent in the mask; the canvas is see-through by CSS instead (app.css). */
const PAINT = 'rgb(255, 0, 96)';

export class MaskPainter {
  private painted = false;
  private last: { x: number; y: number } | undefined;

  constructor(
    private readonly canvas: HTMLCanvasElement,
    private readonly source: HTMLImageElement,
    private readonly brush: HTMLInputElement,
    private readonly erase: HTMLInputElement,
  ) {
    canvas.addEventListener('pointerdown', (event) => {
      canvas.setPointerCapture(event.pointerId);
      this.last = undefined;
      this.stroke(event);
    });
    canvas.addEventListener('pointermove', (event) => {
      if (canvas.hasPointerCapture(event.pointerId)) this.stroke(event);
    });
    canvas.addEventListener('pointerup', () => (this.last = undefined));
  }

  /** Shows a new picture to edit; the mask starts empty. */
  async load(image: Blob): Promise<void> {
    URL.revokeObjectURL(this.source.src);
    this.source.src = URL.createObjectURL(image);
    await this.source.decode();
    this.canvas.width = this.source.naturalWidth;
    this.canvas.height = this.source.naturalHeight;
    this.clear();
  }

  clear(): void {
    this.context().clearRect(0, 0, this.canvas.width, this.canvas.height);
    this.painted = false;
  }

  /** The mask to send, or undefined when nothing is painted (then the whole picture is redrawn). */
  async toBlob(): Promise<Blob | undefined> {
    if (!this.painted) return undefined;
    const mask = document.createElement('canvas');
    [mask.width, mask.height] = [this.canvas.width, this.canvas.height];
    const context = mask.getContext('2d')!;
    context.fillStyle = '#000';
    context.fillRect(0, 0, mask.width, mask.height);
    // Painted pixels punch holes in the opaque mask: fully transparent where the paint is.
    context.globalCompositeOperation = 'destination-out';
    context.drawImage(this.canvas, 0, 0);
    return new Promise((resolve, reject) => mask.toBlob((blob) => (blob ? resolve(blob) : reject(new Error('the mask could not be encoded'))), 'image/png'));
  }

  private context(): CanvasRenderingContext2D {
    return this.canvas.getContext('2d')!;
  }

  /** A line from the last point to this one, the brush's width in picture pixels. */
  private stroke(event: PointerEvent): void {
    const box = this.canvas.getBoundingClientRect();
    const scale = this.canvas.width / box.width;
    const point = { x: (event.clientX - box.left) * scale, y: (event.clientY - box.top) * scale };
    const context = this.context();
    context.globalCompositeOperation = this.erase.checked ? 'destination-out' : 'source-over';
    context.strokeStyle = PAINT;
    context.lineWidth = Number(this.brush.value) * scale;
    context.lineCap = 'round';
    context.beginPath();
    const from = this.last ?? point;
    context.moveTo(from.x, from.y);
    context.lineTo(point.x, point.y);
    context.stroke();
    this.last = point;
    if (!this.erase.checked) this.painted = true;
  }
}
