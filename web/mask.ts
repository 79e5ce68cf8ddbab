/**
 * The edit's picture and the mask painted over it. The canvas has the picture's own pixel size (the
 * server wants a mask of exactly that size) and is scaled by CSS; a stroke paints where the image is
 * redrawn. The mask sent is OpenAI's kind: opaque where the picture is kept, transparent where painted.
 * It paints with a pointer, or from the keyboard: the arrow keys move a brush cursor (Shift: farther)
 * and Space held down paints along its way.
 */

/** Keys that move the keyboard brush, as steps of x and y. */
const MOVES: Record<string, [number, number]> = { ArrowLeft: [-1, 0], ArrowRight: [1, 0], ArrowUp: [0, -1], ArrowDown: [0, 1] };

/** Opaque, so a stroke is fully transparent in the mask; the canvas is see-through by CSS instead (app.css). */
const PAINT = 'rgb(255, 0, 96)';

export class MaskPainter {
  private painted = false;
  private last: Point | undefined;
  /** The keyboard brush, in picture pixels, and whether Space holds it down. */
  private cursor: Point = { x: 0, y: 0 };
  private keyDown = false;

  constructor(
    private readonly canvas: HTMLCanvasElement,
    private readonly source: HTMLImageElement,
    private readonly brush: HTMLInputElement,
    private readonly erase: HTMLInputElement,
    /** Shows the keyboard brush over the canvas while the canvas has the focus. */
    private readonly cursorMark: HTMLElement,
  ) {
    canvas.addEventListener('pointerdown', (event) => {
      canvas.setPointerCapture(event.pointerId);
      this.last = undefined;
      this.stroke(this.pointOf(event));
    });
    canvas.addEventListener('pointermove', (event) => {
      if (canvas.hasPointerCapture(event.pointerId)) this.stroke(this.pointOf(event));
    });
    canvas.addEventListener('pointerup', () => (this.last = undefined));
    canvas.addEventListener('keydown', (event) => this.key(event));
    canvas.addEventListener('keyup', (event) => {
      if (event.key === ' ') [this.keyDown, this.last] = [false, undefined];
    });
    canvas.addEventListener('focus', () => this.showCursor());
    canvas.addEventListener('blur', () => ((cursorMark.hidden = true), (this.keyDown = false)));
  }

  /** Shows a new picture to edit; the mask starts empty. One that cannot be decoded throws and leaves the panel as it was. */
  async load(image: Blob): Promise<void> {
    // Decoded aside first, so that the panel keeps its picture when this one cannot be.
    const decoded = Object.assign(new Image(), { src: URL.createObjectURL(image) });
    try {
      await decoded.decode();
    } catch (err) {
      URL.revokeObjectURL(decoded.src);
      throw err;
    }
    URL.revokeObjectURL(this.source.src);
    this.source.src = decoded.src;
    // The shown picture sizes the canvas over it (app.css): laid out before anyone paints or scrolls to it.
    await this.source.decode().catch(() => undefined);
    this.canvas.width = decoded.naturalWidth;
    this.canvas.height = decoded.naturalHeight;
    this.cursor = { x: this.canvas.width / 2, y: this.canvas.height / 2 };
    this.clear();
  }

  /** The picture's pixel size (the mask's). */
  get extent(): { width: number; height: number } {
    return { width: this.canvas.width, height: this.canvas.height };
  }

  clear(): void {
    this.context().clearRect(0, 0, this.canvas.width, this.canvas.height);
    this.painted = false;
  }

  /**
   * The mask to send, or undefined when nothing is painted (then the whole picture is redrawn), also
   * when every stroke was erased again: an opaque mask would keep the whole picture instead.
   */
  async toBlob(): Promise<Blob | undefined> {
    if (!this.painted || !this.anyFullyPainted()) return undefined;
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

  /** Whether some pixel is fully painted: only those are fully transparent in the mask, where the server repaints. */
  private anyFullyPainted(): boolean {
    const { data } = this.context().getImageData(0, 0, this.canvas.width, this.canvas.height);
    for (let alpha = 3; alpha < data.length; alpha += 4) if (data[alpha] === 255) return true;
    return false;
  }

  private context(): CanvasRenderingContext2D {
    return this.canvas.getContext('2d')!;
  }

  /** Picture pixels per screen pixel: the brush size is on the screen. */
  private scale(): number {
    return this.canvas.width / this.canvas.getBoundingClientRect().width;
  }

  private pointOf(event: PointerEvent): Point {
    const box = this.canvas.getBoundingClientRect();
    const scale = this.scale();
    return { x: (event.clientX - box.left) * scale, y: (event.clientY - box.top) * scale };
  }

  /** Arrows move the keyboard brush by half its size (Shift: twice its size); Space paints where it is and, held, along its way. */
  private key(event: KeyboardEvent): void {
    const move = MOVES[event.key];
    if (event.key === ' ') {
      event.preventDefault();
      if (event.repeat) return;
      this.keyDown = true;
      this.last = undefined;
      this.stroke(this.cursor);
    } else if (move) {
      event.preventDefault();
      const step = Number(this.brush.value) * this.scale() * (event.shiftKey ? 2 : 0.5);
      const clamp = (v: number, max: number) => Math.min(max, Math.max(0, v));
      this.cursor = { x: clamp(this.cursor.x + move[0] * step, this.canvas.width), y: clamp(this.cursor.y + move[1] * step, this.canvas.height) };
      if (this.keyDown) this.stroke(this.cursor);
      this.showCursor();
    }
  }

  /** The keyboard brush's mark: a circle of the brush's size where it is, in the canvas's displayed size. */
  private showCursor(): void {
    const size = Number(this.brush.value);
    const scale = this.scale();
    Object.assign(this.cursorMark.style, {
      left: `${this.cursor.x / scale - size / 2}px`,
      top: `${this.cursor.y / scale - size / 2}px`,
      width: `${size}px`,
      height: `${size}px`,
    });
    this.cursorMark.hidden = false;
  }

  /** A line from the last point to this one, the brush's width in picture pixels. */
  private stroke(point: Point): void {
    const context = this.context();
    context.globalCompositeOperation = this.erase.checked ? 'destination-out' : 'source-over';
    context.strokeStyle = PAINT;
    context.lineWidth = Number(this.brush.value) * this.scale();
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

interface Point {
  x: number;
  y: number;
}
