import { trace } from '@opentelemetry/api';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import { derivedRunSpanContext, traceparentOf } from '../../src/observability/tracing.js';

/**
 * Without an OpenTelemetry SDK (no provider registered in this file's process) the worker makes no
 * spans at all, but each tool still gets the run's trace context as ctx.traceparent (the derived
 * one: trace id = the run id), so the services it calls join the run's trace — what the API's
 * no-op spans handed on before the worker skipped them.
 */
const cls = defineToolClass({ name: 'untraced', lease: '5s', heartbeat: '1s', timeout: '5s', maxDuration: '30s' });
const seen = defineTool({
  name: 'seen',
  description: 'returns the traceparent it was given',
  class: cls,
  input: z.object({}).passthrough(),
  output: z.object({ traceparent: z.string().nullable() }),
  run: async (_input, ctx) => ({ traceparent: ctx.traceparent ?? null }),
});
const twice = defineWorkflow({
  name: 'untraced-twice',
  input: z.object({}),
  steps: [
    { tool: seen, name: 'first' },
    { tool: seen, name: 'second' },
  ],
});

describe('tracing without an SDK', () => {
  it('each tool call gets the run’s derived traceparent; stages of several runs each get their own', async () => {
    expect(trace.getTracerProvider().getTracer('x').startSpan('probe').isRecording()).toBe(false); // no SDK here
    const r = await createRatchet({ dataDir: ':memory:', workflows: [twice], logger: silentLogger() });
    try {
      await r.worker({ pollIntervalMs: 20 }).start();
      const ids = await Promise.all([r.submit('untraced-twice', {}), r.submit('untraced-twice', {})]);
      for (const { id } of ids) {
        const end = Date.now() + 30_000;
        let run = await r.store.getRun(id);
        while (run?.state !== 'succeeded' && Date.now() < end) {
          await new Promise((res) => setTimeout(res, 20));
          run = await r.store.getRun(id);
        }
        expect(run?.state).toBe('succeeded');
        const want = traceparentOf(derivedRunSpanContext(id));
        expect(run!.stages.map((s) => (s.result as { traceparent: string | null }).traceparent)).toEqual([want, want]);
      }
    } finally {
      await r.close();
    }
  });
});
