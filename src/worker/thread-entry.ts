/**
 * The worker_threads side of the thread runner (isolation: 'thread'). A tool thread is started
 * by thread-runner.ts with a small bootstrap that registers tsx's hooks in the thread (the
 * loader's way) and imports this file; it then runs one invocation at a time:
 *
 * - it imports the workflow's `sourceFile` (evaluated once per thread), finds the workflow by
 *   name among the module's exports and the tool by name among its steps;
 * - it calls `run` or `reconcile` with a ctx whose `signal` aborts when the main thread posts
 *   an abort (the reason as an AttemptAbortedError with `.code`), whose `heartbeat` and `log`
 *   post to the main thread, and whose `beginEffect` checks the shared memory synchronously:
 *   the abort code and the lease confirmation deadline, both written by the main thread;
 * - it posts the result, or the error as plain data (name, message, code, kind) that the main
 *   thread turns back into PermanentError / TransientError / AttemptAbortedError.
 *
 * Importing this module in the main thread only gives the protocol below: the thread loop
 * starts only inside a tool thread (workerData carries THREAD_MARK).
 */
import { pathToFileURL } from 'node:url';
import { isMainThread, parentPort, workerData, type MessagePort } from 'node:worker_threads';
import pino from 'pino';
import type { Tool, ToolContext, Workflow } from '../definitions/types.js';
import { AttemptAbortedError, PermanentError, RatchetError, TransientError, type AbortReason } from '../errors.js';

// ---------------------------------------------------------------------------------------------
// The protocol, shared with thread-runner.ts
// ---------------------------------------------------------------------------------------------

export const THREAD_MARK = 'ratchet.tool-thread.v1';

/**
 * Int32 abort codes in the shared memory: 0 = not aborted, else 1 + the index here. The main
 * thread writes the reason that ends the attempt over an earlier ownership_unknown.
 */
export const ABORT_REASONS: readonly AbortReason[] = [
  'lease_lost',
  'ownership_unknown',
  'cancelled',
  'timeout',
  'stage_duration_exceeded',
  'shutdown',
  'run_deadline',
];
export const abortCodeOf = (reason: AbortReason): number => ABORT_REASONS.indexOf(reason) + 1;
export const abortReasonOf = (code: number): AbortReason | null => ABORT_REASONS[code - 1] ?? null;

/**
 * Per invocation, 16 bytes: [0..8) BigInt64 the lease confirmation deadline in microseconds
 * since the epoch on the `performance.timeOrigin + performance.now()` scale (Atomics work on
 * BigInt64Array, not on Float64Array, hence integer microseconds; each thread's
 * performance.now() has its own origin, the sum does not); [8..12) Int32 the abort code.
 */
export const SHARED_BYTES = 16;
export function sharedViews(buffer: SharedArrayBuffer): { deadlineUs: BigInt64Array; abort: Int32Array } {
  return { deadlineUs: new BigInt64Array(buffer, 0, 1), abort: new Int32Array(buffer, 8, 1) };
}
/** A monotonic time of this thread (performance.now()) as absolute microseconds, rounded down. */
export const absoluteMicros = (monotonicMs: number): bigint => BigInt(Math.floor((performance.timeOrigin + monotonicMs) * 1000));

export interface RunRequest {
  type: 'run';
  id: number;
  op: 'run' | 'reconcile';
  sourceFile: string;
  workflow: string;
  workflowHash: string;
  tool: string;
  input: unknown;
  ctx: { fence: string; idempotencyKey: string; attempt: number; runId: string; stageId: string; traceparent?: string };
  logLevel: string;
  shared: SharedArrayBuffer;
}

export interface AbortRequest {
  type: 'abort';
  id: number;
  reason: AbortReason;
  message: string;
  details: Record<string, unknown>;
}

export type ToThread = RunRequest | AbortRequest;

/** An error as plain data: what crosses back by structured clone. */
export type WireError =
  | {
      thrown: 'error';
      name: string;
      message: string;
      code?: string;
      /** PermanentError / TransientError (by class or by their `kind` field). */
      kind?: 'permanent' | 'transient';
      abortReason?: AbortReason;
      /** A RatchetError's details (JSON-safe copy). */
      details?: Record<string, unknown>;
      /** A ZodError's issues. */
      issues?: unknown[];
      stack?: string;
    }
  | { thrown: 'value'; value: unknown };

export type ToMain =
  | { type: 'done'; id: number; ok: true; value: unknown }
  | { type: 'done'; id: number; ok: false; error: WireError }
  | { type: 'heartbeat'; id: number; details: unknown }
  | { type: 'effect'; id: number; requestId: string }
  | { type: 'log'; id: number; line: string }
  | { type: 'ownership_check'; id: number };

function jsonSafe(value: unknown): Record<string, unknown> | undefined {
  try {
    return JSON.parse(JSON.stringify(value)) as Record<string, unknown>;
  } catch {
    return undefined;
  }
}

export function toWireError(err: unknown): WireError {
  if (
    err instanceof Error ||
    (typeof err === 'object' && err !== null && typeof (err as Error).message === 'string' && typeof (err as Error).name === 'string')
  ) {
    const e = err as Error & { code?: unknown; kind?: unknown; issues?: unknown };
    const out: WireError = { thrown: 'error', name: e.name, message: e.message };
    if (typeof e.code === 'string') out.code = e.code;
    if (err instanceof PermanentError || e.kind === 'permanent') out.kind = 'permanent';
    else if (err instanceof TransientError || e.kind === 'transient') out.kind = 'transient';
    if (err instanceof AttemptAbortedError) out.abortReason = err.reason;
    if (err instanceof RatchetError) out.details = jsonSafe(err.details) ?? {};
    if (e.name === 'ZodError' && Array.isArray(e.issues)) out.issues = jsonSafe({ issues: e.issues })?.issues as unknown[] | undefined;
    if (typeof e.stack === 'string') out.stack = e.stack;
    return out;
  }
  try {
    return { thrown: 'value', value: structuredClone(err) };
  } catch {
    return { thrown: 'value', value: String(err) };
  }
}

// ---------------------------------------------------------------------------------------------
// The thread loop
// ---------------------------------------------------------------------------------------------

interface Running {
  controller: AbortController;
  finished: boolean;
}

function startThread(port: MessagePort): void {
  const running = new Map<number, Running>();
  const post = (m: ToMain) => port.postMessage(m);

  port.on('message', (m: ToThread) => {
    if (m.type === 'run') void execute(m);
    else if (m.type === 'abort') {
      const r = running.get(m.id);
      if (r && !r.controller.signal.aborted) r.controller.abort(new AttemptAbortedError(m.reason, m.message, m.details));
    }
  });

  async function execute(req: RunRequest): Promise<void> {
    const { id } = req;
    const state: Running = { controller: new AbortController(), finished: false };
    running.set(id, state);
    const views = sharedViews(req.shared);
    const details = { runId: req.ctx.runId, stageId: req.ctx.stageId, fence: req.ctx.fence };
    const aborted = abortReasonOf(Atomics.load(views.abort, 0));
    if (aborted) state.controller.abort(new AttemptAbortedError(aborted, `attempt aborted: ${aborted}`, details));

    const log = pino({ level: req.logLevel, base: null, timestamp: false }, { write: (line: string) => post({ type: 'log', id, line }) });
    const ctx: ToolContext = {
      signal: state.controller.signal,
      fence: req.ctx.fence,
      idempotencyKey: req.ctx.idempotencyKey,
      attempt: req.ctx.attempt,
      runId: req.ctx.runId,
      stageId: req.ctx.stageId,
      ...(req.ctx.traceparent ? { traceparent: req.ctx.traceparent } : {}),
      heartbeat(hbDetails?: unknown) {
        try {
          post({ type: 'heartbeat', id, details: hbDetails });
        } catch {
          post({ type: 'heartbeat', id, details: String(hbDetails) });
        }
      },
      // Synchronous, on the shared memory: a message from the main thread may sit unread
      // behind this thread's own busy work, the shared abort code and deadline do not.
      beginEffect(requestId: string) {
        const reason = abortReasonOf(Atomics.load(views.abort, 0));
        if (reason) {
          const own = state.controller.signal.aborted ? (state.controller.signal.reason as unknown) : null;
          throw own instanceof AttemptAbortedError && own.reason === reason
            ? own
            : new AttemptAbortedError(reason, `attempt aborted: ${reason}`, details);
        }
        if (state.finished) {
          throw new AttemptAbortedError(
            'ownership_unknown',
            'beginEffect after the attempt ended: its ownership cannot be vouched for',
            details,
          );
        }
        const nowUs = (performance.timeOrigin + performance.now()) * 1000;
        if (nowUs >= Number(Atomics.load(views.deadlineUs, 0))) {
          post({ type: 'ownership_check', id });
          throw new AttemptAbortedError('ownership_unknown', 'lease confirmation deadline passed', details);
        }
        post({ type: 'effect', id, requestId });
      },
      log,
    };

    let result: ToMain;
    try {
      const tool = await findTool(req);
      let value: unknown;
      if (req.op === 'run') value = await tool.run(req.input, ctx);
      else if (tool.reconcile) value = await tool.reconcile(req.input, ctx);
      else throw new PermanentError(`tool ${tool.name} has no reconcile()`, { code: 'no_reconcile' });
      result = { type: 'done', id, ok: true, value };
    } catch (err) {
      result = { type: 'done', id, ok: false, error: toWireError(err) };
    }
    state.finished = true;
    running.delete(id);
    try {
      post(result);
    } catch (err) {
      // Not structured-cloneable (a function, a class with private state, ...).
      post({
        type: 'done',
        id,
        ok: false,
        error: toWireError(
          new PermanentError(
            `${req.op === 'run' ? 'output' : 'reconcile result'} of ${req.tool} cannot cross from its thread: ${(err as Error).message}`,
            { code: 'invalid_output' },
          ),
        ),
      });
    }
  }
}

const modules = new Map<string, Promise<Record<string, unknown>>>();

function isWorkflowLike(value: unknown): value is Workflow {
  const v = value as Partial<Workflow> | null;
  return typeof v === 'object' && v !== null && v.kind === 'workflow' && typeof v.name === 'string' && Array.isArray(v.steps);
}

/** The tool as this thread's copy of the workflow file defines it; the definition must be the main thread's. */
async function findTool(req: RunRequest): Promise<Tool> {
  let module = modules.get(req.sourceFile);
  if (!module) {
    module = import(pathToFileURL(req.sourceFile).href) as Promise<Record<string, unknown>>;
    modules.set(req.sourceFile, module);
  }
  let exports: Record<string, unknown>;
  try {
    exports = await module;
  } catch (err) {
    throw new PermanentError(`the tool thread cannot load ${req.sourceFile}: ${(err as Error).message}`, {
      code: 'thread_load_failed',
      cause: err,
    });
  }
  // One file may export several versions of a workflow: the one with the worker's hash, else the name alone (then refused below).
  const named = Object.values(exports).filter((v): v is Workflow => isWorkflowLike(v) && v.name === req.workflow);
  const workflow = named.find((w) => w.hash === req.workflowHash) ?? named[0];
  if (!workflow) {
    throw new PermanentError(`${req.sourceFile} does not export workflow "${req.workflow}" in the tool thread`, {
      code: 'thread_tool_not_found',
    });
  }
  if (workflow.hash !== req.workflowHash) {
    throw new PermanentError(
      `workflow "${req.workflow}" in ${req.sourceFile} changed since this worker loaded it ` +
        `(${req.workflowHash} in the worker, ${workflow.hash} in the tool thread): restart the worker`,
      { code: 'definition_changed' },
    );
  }
  const step = workflow.steps.find((s) => s.tool.name === req.tool);
  if (!step) {
    throw new PermanentError(`workflow "${req.workflow}" in ${req.sourceFile} has no step with tool "${req.tool}" in the tool thread`, {
      code: 'thread_tool_not_found',
    });
  }
  return step.tool;
}

if (!isMainThread && parentPort && (workerData as { mark?: unknown } | null)?.mark === THREAD_MARK) startThread(parentPort);
