import {
  context,
  isSpanContextValid,
  ProxyTracerProvider,
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  trace,
  TraceFlags,
  type Attributes,
  type Context,
  type Span,
  type SpanContext,
} from '@opentelemetry/api';
import type { ModelSpec, ToolContext } from '../definitions/types.js';
import type { ClaimedStage } from '../store/lease.js';
import { usageOf } from './model-usage.js';
import { sha256Hex } from '../util/hash.js';

/**
 * OpenTelemetry spans through `@opentelemetry/api` only: with no SDK registered every call here
 * is the API's no-op (no exporter is forced on anyone). The tree of a run:
 *
 *   ratchet.run             at submit (ended there: a run outlives any process), its W3C
 *   │                       traceparent stored on the run (runs.traceparent)
 *   └ ratchet.attempt       one per claimed attempt, in the worker that ran it: fence, attempt,
 *     │                     stage id and seq, run id, workflow, tool, tool class, outcome
 *     ├ ratchet.tool        the tool's run (or reconcile); its traceparent is ctx.traceparent,
 *     │                     which the example tools send downstream as the `traceparent` header
 *     └ ratchet.model       a model stage's chat-completions call (gen_ai.* attributes, tokens, cost)
 *
 * A run spans processes, so no span is held open across them: each attempt span is a child of
 * the run's span context, read back from the run row at claim. A run submitted where no tracer
 * recorded its span (no SDK in the submitting process, a schedule tick, a child run) has a
 * DERIVED context instead: trace id = the run id's 32 hex digits, parent span id = the first 16
 * hex of sha256("ratchet.run:" + run id) — every process finds the same trace from the run id
 * alone (that parent span itself is never exported).
 */
const tracer = trace.getTracer('ratchet', '0.1.0');

const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

/** The W3C traceparent header value of a span context. */
export function traceparentOf(sc: SpanContext): string {
  return `00-${sc.traceId}-${sc.spanId}-${(sc.traceFlags & 0xff).toString(16).padStart(2, '0')}`;
}

/** A traceparent as a remote span context, or null when malformed or all-zero. */
export function parseTraceparent(value: string | null | undefined): SpanContext | null {
  const m = value ? TRACEPARENT.exec(value) : null;
  if (!m) return null;
  const sc: SpanContext = { traceId: m[1]!, spanId: m[2]!, traceFlags: Number.parseInt(m[3]!, 16), isRemote: true };
  return isSpanContextValid(sc) ? sc : null;
}

/** The span context derived from a run id alone (see above). */
export function derivedRunSpanContext(runId: string): SpanContext {
  const ids = derivedIds(runId);
  return { traceId: ids.traceId, spanId: ids.spanId, traceFlags: TraceFlags.SAMPLED, isRemote: true };
}

/**
 * The derived ids of the runs seen lately: every attempt span of a run without a stored
 * traceparent needs them, and a run's stages follow each other in the same worker (the fast
 * path), so the sha256 is taken once per run, not per stage. Bounded: emptied when full.
 */
const derived = new Map<string, { traceId: string; spanId: string }>();
const DERIVED_KEPT = 1024;
function derivedIds(runId: string): { traceId: string; spanId: string } {
  let ids = derived.get(runId);
  if (ids === undefined) {
    ids = {
      traceId: runId.replace(/-/g, '').toLowerCase(),
      spanId: sha256Hex(`ratchet.run:${runId}`).slice(0, 16),
    };
    if (derived.size >= DERIVED_KEPT) derived.clear();
    derived.set(runId, ids);
  }
  return ids;
}

/** The run's span context: the stored one, else the derived one. */
export function runSpanContext(runId: string, traceparent: string | null | undefined): SpanContext {
  return parseTraceparent(traceparent) ?? derivedRunSpanContext(runId);
}

/** The trace id a run's spans carry (GET /v1/runs/:id shows it). */
export const runTraceId = (runId: string, traceparent: string | null | undefined): string => runSpanContext(runId, traceparent).traceId;

/**
 * The `ratchet.run` span of a run about to be submitted (a child of the caller's active span,
 * when it has one): ended at once by `end`. `traceparent` is what to store on the run — only
 * when a tracer recorded the span, so a run submitted without an SDK uses the derived context.
 */
export function startRunSpan(runId: string, workflow: string): { traceparent: string | undefined; end(created: boolean): void } {
  const span = tracer.startSpan(
    'ratchet.run',
    { kind: SpanKind.INTERNAL, attributes: { 'ratchet.run_id': runId, 'ratchet.workflow': workflow } },
    context.active(),
  );
  const recorded = span.isRecording() && isSpanContextValid(span.spanContext());
  return {
    traceparent: recorded ? traceparentOf(span.spanContext()) : undefined,
    end(created) {
      span.setAttribute('ratchet.created', created);
      span.end();
    },
  };
}

/** The attempt span's context by `stageId:fence`, for its tool and model spans (no context manager needed). */
const attempts = new Map<string, Context>();
const attemptKey = (stageId: string, fence: string) => `${stageId}:${fence}`;

/**
 * Without an SDK an attempt has no span of its own: its tool and model spans' parent is its run's
 * context, kept here by `stageId:fence` as the run's span context and its traceparent (the tool's
 * ctx.traceparent), not as a Context (an OpenTelemetry Context, a no-op span and a traceparent
 * string built per stage were ~2% of a worker's CPU, PERF-NOTES §11). One per run seen lately: a
 * run's stages follow each other in the same worker (the fast path). Bounded: emptied when full.
 */
interface RunTrace {
  /** The run's stored traceparent (null: none), the key's second half. */
  stored: string | null;
  sc: SpanContext;
  /** The traceparent a tool gets, or undefined when the context is not valid (the tool's ctx then has none). */
  traceparent: string | undefined;
}
const runTraces = new Map<string, RunTrace>();
const plainAttempts = new Map<string, RunTrace>();
function runTrace(runId: string, stored: string | null | undefined): RunTrace {
  const s = stored ?? null;
  let t = runTraces.get(runId);
  if (t === undefined || t.stored !== s) {
    const sc = runSpanContext(runId, s);
    t = { stored: s, sc, traceparent: isSpanContextValid(sc) ? traceparentOf(sc) : undefined };
    if (runTraces.size >= DERIVED_KEPT) runTraces.clear();
    runTraces.set(runId, t);
  }
  return t;
}

function attemptContext(stageId: string, fence: string, runId: string): Context {
  const key = attemptKey(stageId, fence);
  const ctx = attempts.get(key);
  if (ctx) return ctx;
  return trace.setSpanContext(ROOT_CONTEXT, plainAttempts.get(key)?.sc ?? derivedRunSpanContext(runId));
}

function failed(span: Span, err: unknown): void {
  span.recordException(err instanceof Error ? err : String(err));
  const code = (err as { code?: unknown } | null)?.code;
  if (typeof code === 'string') span.setAttribute('ratchet.error_code', code);
  span.setStatus({ code: SpanStatusCode.ERROR, message: err instanceof Error ? err.message.slice(0, 200) : undefined });
}

/**
 * Whether an SDK is registered: the global provider (the API's proxy) delegates to one. Without
 * one, every span the API makes is its no-op, whose context is its parent's: the attempt and
 * tool spans below then skip the no-op spans and their attributes, and hand on the same contexts.
 * Asked per span (an SDK may be registered, or tracing disabled, at any time).
 */
const NO_SDK = new ProxyTracerProvider().getDelegate();
function sdkRegistered(): boolean {
  const provider = trace.getTracerProvider();
  return !(provider instanceof ProxyTracerProvider) || provider.getDelegate() !== NO_SDK;
}

/**
 * The `ratchet.attempt` span around one claimed stage's execution (the worker's hook around
 * executeStage). `run` resolves to the attempt's end ('succeeded', 'retry', 'rejected', ...),
 * recorded as `ratchet.outcome`.
 */
export async function traceAttempt<T extends string>(stage: ClaimedStage, run: () => Promise<T>): Promise<T> {
  const key = attemptKey(stage.id, stage.fence);
  if (!sdkRegistered()) {
    // The no-op attempt span's context would be the run's: its tool spans' parent is the run's context.
    plainAttempts.set(key, runTrace(stage.runId, stage.runTraceparent));
    try {
      return await run();
    } finally {
      plainAttempts.delete(key);
    }
  }
  const parent = trace.setSpanContext(ROOT_CONTEXT, runSpanContext(stage.runId, stage.runTraceparent));
  const attributes: Attributes = {
    'ratchet.run_id': stage.runId,
    'ratchet.workflow': stage.workflow,
    'ratchet.stage_id': stage.id,
    'ratchet.stage_seq': stage.seq,
    'ratchet.stage_name': stage.name,
    'ratchet.tool': stage.tool,
    'ratchet.tool_class': stage.toolClass,
    'ratchet.fence': stage.fence,
    'ratchet.attempt': stage.attempt,
    'ratchet.reclaim': stage.previousState === 'running',
  };
  const span = tracer.startSpan('ratchet.attempt', { kind: SpanKind.INTERNAL, attributes }, parent);
  attempts.set(key, trace.setSpan(parent, span));
  try {
    const end = await run();
    span.setAttribute('ratchet.outcome', end);
    if (end === 'failed' || end === 'unknown') span.setStatus({ code: SpanStatusCode.ERROR, message: end });
    return end;
  } catch (err) {
    failed(span, err);
    throw err;
  } finally {
    attempts.delete(key);
    span.end();
  }
}

/**
 * `{ ...ctx, traceparent }` without reading ctx's getters: the same own enumerable keys (strings
 * and symbols), a data property copied as its value, an accessor copied as the accessor, so the
 * executor's `ctx.signal` getter stays lazy (the attempt makes its AbortSignal at the tool's first
 * read, not here; PERF-NOTES §15). Exported for its test.
 */
export function withTraceparent(ctx: ToolContext, traceparent: string): ToolContext {
  const copy: Record<PropertyKey, unknown> = {};
  for (const key of Reflect.ownKeys(ctx)) {
    if (key === 'traceparent') continue;
    const d = Object.getOwnPropertyDescriptor(ctx, key);
    if (!d?.enumerable) continue;
    if (d.get || d.set) Object.defineProperty(copy, key, { get: d.get, set: d.set, enumerable: true, configurable: true });
    else copy[key] = d.value;
  }
  copy.traceparent = traceparent;
  return copy as unknown as ToolContext;
}

/**
 * The `ratchet.tool` span around a tool's run or reconcile: the tool gets a ctx whose
 * `traceparent` is this span's (what it sends downstream), made by `withTp` (default: a copy of
 * ctx that keeps its getters; the executor makes its own ctx literal again, faster than a copy). Also set without an SDK: then it is
 * the run's (derived or stored) context, so a downstream service still joins the run's trace.
 */
export async function traceToolCall<T>(
  inv: { tool: { name: string; class: { name: string } }; ctx: ToolContext },
  op: 'run' | 'reconcile',
  call: (ctx: ToolContext) => Promise<T>,
  withTp: (ctx: ToolContext, traceparent: string) => ToolContext = withTraceparent,
): Promise<T> {
  const { ctx } = inv;
  if (!sdkRegistered()) {
    // The no-op tool span's context would be its attempt's: the tool gets that as its traceparent.
    const plain = plainAttempts.get(attemptKey(ctx.stageId, ctx.fence));
    if (plain) return call(plain.traceparent === undefined ? ctx : withTp(ctx, plain.traceparent));
    const sc = trace.getSpanContext(attemptContext(ctx.stageId, ctx.fence, ctx.runId));
    return call(sc && isSpanContextValid(sc) ? withTp(ctx, traceparentOf(sc)) : ctx);
  }
  const span = tracer.startSpan(
    `ratchet.tool ${inv.tool.name}`,
    {
      kind: SpanKind.CLIENT,
      attributes: {
        'ratchet.run_id': ctx.runId,
        'ratchet.stage_id': ctx.stageId,
        'ratchet.fence': ctx.fence,
        'ratchet.attempt': ctx.attempt,
        'ratchet.tool': inv.tool.name,
        'ratchet.tool_class': inv.tool.class.name,
        'ratchet.tool_op': op,
      },
    },
    attemptContext(ctx.stageId, ctx.fence, ctx.runId),
  );
  const sc = span.spanContext();
  const traced: ToolContext = isSpanContextValid(sc) ? withTp(ctx, traceparentOf(sc)) : ctx;
  try {
    return await call(traced);
  } catch (err) {
    failed(span, err);
    throw err;
  } finally {
    span.end();
  }
}

/** The `ratchet.model` span around a model stage's chat-completions call, with its usage and cost once answered. */
export async function traceModelCall<T extends object>(
  model: Pick<ModelSpec, 'name' | 'pricing' | 'stream'>,
  stage: ClaimedStage,
  call: () => Promise<T>,
): Promise<T> {
  const span = tracer.startSpan(
    `ratchet.model ${model.name}`,
    {
      kind: SpanKind.CLIENT,
      attributes: {
        'gen_ai.operation.name': 'chat',
        'gen_ai.request.model': model.name,
        'ratchet.run_id': stage.runId,
        'ratchet.workflow': stage.workflow,
        'ratchet.stage_id': stage.id,
        'ratchet.fence': stage.fence,
        'ratchet.attempt': stage.attempt,
        'ratchet.tool_class': stage.toolClass,
        'ratchet.stream': model.stream,
      },
    },
    attemptContext(stage.id, stage.fence, stage.runId),
  );
  try {
    const answer = await call();
    const u = usageOf(answer, model.pricing);
    if (u) {
      span.setAttribute('gen_ai.usage.input_tokens', u.inputTokens);
      span.setAttribute('gen_ai.usage.output_tokens', u.outputTokens);
      if (u.cost !== undefined) span.setAttribute('ratchet.cost', u.cost);
    }
    return answer;
  } catch (err) {
    failed(span, err);
    throw err;
  } finally {
    span.end();
  }
}
