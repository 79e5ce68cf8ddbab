/**
 * Turns onnxruntime's telemetry off in this process and the processes it starts, unless the
 * environment already says what it wants. onnxruntime-node's Linux build (1.30) carries Microsoft's
 * 1DS telemetry: left on, every process that creates a session keeps a device id and an event database
 * under ~/.cache/Microsoft/DeveloperTools/.onnxruntime, writes an empty /tmp/mat-debug-<pid>.log, and
 * uploads its events (machine, models' producers and opsets, providers, run times) to
 * mobile.events.data.microsoft.com whenever it can reach it. A self-hosted server sends nothing
 * anywhere unasked. The library reads its opt-out as it starts (ORT_DISABLE_TELEMETRY in 1.30;
 * ORT_TELEMETRY_DISABLED in its later sources), so this module runs before onnxruntime-node loads: see
 * onnxruntime.ts, through which every module of ours imports it.
 */
for (const name of ['ORT_DISABLE_TELEMETRY', 'ORT_TELEMETRY_DISABLED']) process.env[name] ??= '1';
