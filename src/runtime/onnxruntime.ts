/**
 * onnxruntime-node, for every module that runs it. Imported from here, never directly, so that its
 * telemetry is off before it loads (telemetry-off.ts); an ES module's imports run in the order they
 * are written, so the opt-out is set before the library's first line.
 */
import './telemetry-off.js';

export * as ort from 'onnxruntime-node';
