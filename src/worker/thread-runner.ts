import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { Worker as NodeWorker, type ResourceLimits } from 'node:worker_threads';
import type { Logger } from 'pino';
import { ZodError } from 'zod';
import type { Tool, Workflow } from '../definitions/types.js';
import { AttemptAbortedError, InvalidDefinitionError, PermanentError, RatchetError, TransientError, type ErrorCode } from '../errors.js';
import { silentLogger } from '../logger.js';
import type { Attempt } from './attempt.js';
import type { ToolInvocation, ToolRunner } from './executor.js';
import {
  abortCodeOf,
  absoluteMicros,
  SHARED_BYTES,
  sharedViews,
  THREAD_MARK,
  type RunRequest,
  type ToMain,
  type ToThread,
  type WireError,
} from './thread-entry.js';

export interface ThreadRunnerOptions {
  /** Where the runner logs thread starts, crashes and terminations (default: silent). */
  logger?: Logger;
  /** Idle threads kept for reuse (default 4). A busy invocation never waits for a thread: one is started. */
  maxIdleThreads?: number;
  /** An idle thread is terminated after this long (default 30 s). */
  idleTimeoutMs?: number;
  /**
   * After the attempt is aborted for good (timeout, lease lost, cancelled, maxDuration, the
   * run's deadline, shutdown — also when one of these comes after ownership_unknown, which
   * alone only informs the tool), how long the tool may keep its thread to wind down before
   * the thread is terminated (default DEFAULT_ABANDON_GRACE_MS, 10 s). The attempt itself is
   * over at once: its slot is free and nobody waits for the tool.
   */
  abandonGraceMs?: number;
  /** Passed to each Worker (heap limits per tool thread). */
  resourceLimits?: ResourceLimits;
}

/** A ToolRunner that owns threads: close() terminates them. */
export interface ThreadRunner extends ToolRunner {
  close(): Promise<void>;
  /** Threads alive now, and how many run an invocation. */
  stats(): { threads: number; busy: number };
}

const DEFAULT_MAX_IDLE = 4;
const DEFAULT_IDLE_TIMEOUT_MS = 30_000;
/** How long a tool whose attempt ended for good keeps its thread before it is terminated. */
export const DEFAULT_ABANDON_GRACE_MS = 10_000;

/** Why a thread-isolated tool cannot run: its workflow was defined in code, not loaded from a file. */
function noSourceMessage(workflow: Workflow, tool: Tool): string {
  return (
    `workflow "${workflow.name}" runs tool "${tool.name}" of class "${tool.class.name}" with isolation 'thread', but the workflow has no ` +
    'sourceFile: a tool thread loads the tool from the file its workflow came from. Load the workflow from a folder ' +
    "(createRatchet({ workflowsDir }) / loadWorkflows(dir)), or use isolation 'none' for a workflow defined in code"
  );
}

/**
 * Refuses, at worker start, to serve a thread-isolated class used by a workflow that has no
 * `sourceFile` (defined in code): such a stage could only ever fail.
 */
export function assertThreadSources(workflows: readonly Workflow[], classes: readonly string[]): void {
  for (const w of workflows) {
    if (w.sourceFile) continue;
    for (const step of w.steps) {
      if (step.tool.class.isolation === 'thread' && classes.includes(step.tool.class.name)) {
        throw new InvalidDefinitionError(noSourceMessage(w, step.tool), `workflows.${w.name}.steps.${step.name}`, {
          workflow: w.name,
          tool: step.tool.name,
          toolClass: step.tool.class.name,
          reason: 'thread_source_unknown',
        });
      }
    }
  }
}

let tsxApi: string | null = null;

/** The ESM entry of tsx's API (`tsx/esm/api`, import condition) as a file URL; its CJS twin cannot register hooks. */
function tsxApiUrl(): string {
  if (tsxApi) return tsxApi;
  const require = createRequire(import.meta.url);
  const pkgFile = require.resolve('tsx/package.json');
  const pkg = JSON.parse(readFileSync(pkgFile, 'utf8')) as { exports?: Record<string, { import?: { default?: string } | string }> };
  const entry = pkg.exports?.['./esm/api']?.import;
  const target = typeof entry === 'string' ? entry : entry?.default;
  if (!target) throw new Error(`cannot find the ESM entry of tsx/esm/api in ${pkgFile}`);
  tsxApi = pathToFileURL(join(dirname(pkgFile), target)).href;
  return tsxApi;
}

/** The thread's entry, beside this file (.ts under tsx / vitest, .js if ever compiled). */
const ENTRY_URL = new URL(import.meta.url.endsWith('.ts') ? './thread-entry.ts' : './thread-entry.js', import.meta.url).href;

/**
 * A tiny CommonJS bootstrap: registers tsx's hooks in the thread (hooks registered by the
 * host's register() do not reach worker threads on Node 20), then imports the entry.
 */
const BOOTSTRAP = `
const { workerData } = require('node:worker_threads');
import(workerData.tsxApi)
  .then((tsx) => { tsx.register(); return import(workerData.entry); })
  .catch((err) => { process.nextTick(() => { throw err; }); });
`;

interface Job {
  id: number;
  inv: ToolInvocation;
  settle(ok: boolean, value: unknown): void;
}

interface ToolThread {
  worker: NodeWorker;
  job: Job | null;
  dead: boolean;
  /** Why this side terminated the thread (else it exited on its own). */
  terminatedFor: string | null;
  idleTimer: NodeJS.Timeout | null;
}

/** An error rebuilt on this side, as classify() and describeError() expect it. */
export function fromWireError(w: WireError): unknown {
  if (w.thrown === 'value') return w.value;
  let err: Error;
  if (w.issues) err = new ZodError(w.issues as ZodError['issues']);
  else if (w.abortReason) err = new AttemptAbortedError(w.abortReason, w.message, w.details ?? {});
  else if (w.kind === 'permanent') err = new PermanentError(w.message, { code: w.code });
  else if (w.kind === 'transient') err = new TransientError(w.message, { code: w.code });
  else if (w.details && w.code) err = new RatchetError(w.code as ErrorCode, w.message, w.details);
  else {
    err = new Error(w.message);
    if (w.code !== undefined) Object.defineProperty(err, 'code', { value: w.code, enumerable: true, writable: true, configurable: true });
  }
  if (err.name !== w.name) Object.defineProperty(err, 'name', { value: w.name, enumerable: false, writable: true, configurable: true });
  if (w.stack) err.stack = w.stack;
  return err;
}

function codedError(code: string, message: string): Error {
  return Object.assign(new Error(message), { code });
}

/** A thread's log line (pino JSON) onto the attempt's logger, keeping its level and fields. */
function forwardLog(log: Logger, line: string): void {
  let rec: Record<string, unknown>;
  try {
    rec = JSON.parse(line) as Record<string, unknown>;
  } catch {
    return;
  }
  const { level, msg, time: _time, pid: _pid, hostname: _hostname, ...fields } = rec;
  const label = typeof level === 'number' ? log.levels.labels[level] : undefined;
  const fn = label ? (log as unknown as Record<string, unknown>)[label] : undefined;
  if (typeof fn === 'function')
    (fn as (obj: object, msg?: string) => void).call(log, { thread: true, ...fields }, typeof msg === 'string' ? msg : undefined);
}

/**
 * Runs tools of `isolation: 'thread'` classes in node:worker_threads, so CPU-bound work cannot
 * starve the main thread's lease keeper. One invocation per thread at a time; finished threads
 * are kept for reuse (a thread imports tsx and the workflow file once, ~100s of ms), idle ones
 * time out. Each invocation shares 16 bytes with its thread (the confirmation deadline and the
 * abort code), so ctx.beginEffect() in the thread refuses synchronously.
 */
export function createThreadRunner(options: ThreadRunnerOptions = {}): ThreadRunner {
  const logger = options.logger ?? silentLogger();
  const maxIdle = options.maxIdleThreads ?? DEFAULT_MAX_IDLE;
  const idleTimeoutMs = options.idleTimeoutMs ?? DEFAULT_IDLE_TIMEOUT_MS;
  const graceMs = options.abandonGraceMs ?? DEFAULT_ABANDON_GRACE_MS;
  const threads = new Set<ToolThread>();
  const idle: ToolThread[] = [];
  let nextId = 0;
  let closed = false;

  function spawn(): ToolThread {
    const worker = new NodeWorker(BOOTSTRAP, {
      eval: true,
      workerData: { mark: THREAD_MARK, tsxApi: tsxApiUrl(), entry: ENTRY_URL },
      resourceLimits: options.resourceLimits,
    });
    const t: ToolThread = { worker, job: null, dead: false, terminatedFor: null, idleTimer: null };
    threads.add(t);
    logger.debug({ event: 'tool_thread_started', threadId: worker.threadId }, 'tool thread started');
    worker.on('message', (m: ToMain) => onMessage(t, m));
    worker.on('error', (err) => {
      logger.error({ event: 'tool_thread_crashed', threadId: worker.threadId, err: err.message }, 'tool thread crashed');
      fail(t, codedError('thread_crashed', `the tool thread crashed: ${err.message}`));
    });
    worker.on('exit', (code) => {
      fail(
        t,
        t.terminatedFor
          ? codedError('thread_terminated', `the tool thread was terminated: ${t.terminatedFor}`)
          : codedError('thread_exited', `the tool thread exited with code ${code}`),
      );
    });
    return t;
  }

  /** The thread is gone (or going): its job, if any, fails; it is never reused. */
  function fail(t: ToolThread, err: Error): void {
    t.dead = true;
    threads.delete(t);
    const i = idle.indexOf(t);
    if (i >= 0) idle.splice(i, 1);
    if (t.idleTimer) clearTimeout(t.idleTimer);
    const job = t.job;
    t.job = null;
    job?.settle(false, err);
  }

  function terminate(t: ToolThread, why: string): Promise<void> {
    if (!t.terminatedFor) t.terminatedFor = why;
    return t.worker.terminate().then(
      () => undefined,
      () => undefined,
    );
  }

  function acquire(): ToolThread {
    for (let t = idle.pop(); t; t = idle.pop()) {
      if (t.dead) continue;
      if (t.idleTimer) clearTimeout(t.idleTimer);
      t.idleTimer = null;
      t.worker.ref();
      return t;
    }
    return spawn();
  }

  function release(t: ToolThread): void {
    if (t.dead) return;
    if (closed || idle.length >= maxIdle) {
      void terminate(t, closed ? 'the runner is closed' : 'more idle threads than maxIdleThreads');
      return;
    }
    t.worker.unref(); // an idle thread never keeps the process alive
    t.idleTimer = setTimeout(() => {
      const i = idle.indexOf(t);
      if (i >= 0) idle.splice(i, 1);
      void terminate(t, 'idle timeout');
    }, idleTimeoutMs);
    t.idleTimer.unref();
    idle.push(t);
  }

  function onMessage(t: ToolThread, m: ToMain): void {
    const job = t.job;
    if (!job || job.id !== m.id) return;
    const { ctx, attempt } = job.inv;
    switch (m.type) {
      case 'done':
        t.job = null;
        job.settle(m.ok, m.ok ? m.value : fromWireError(m.error));
        release(t);
        break;
      case 'effect':
        // The thread passed the gate on the shared memory: the effect has started, record it
        // even if this side has aborted since (it must not be forgotten by the next attempt).
        attempt.recordEffect(m.requestId);
        break;
      case 'heartbeat':
        try {
          ctx.heartbeat(m.details);
        } catch (err) {
          ctx.log.warn({ event: 'tool_heartbeat_failed', err: (err as Error).message }, 'heartbeat from a tool thread failed');
        }
        break;
      case 'log':
        forwardLog(ctx.log, m.line);
        break;
      case 'ownership_check':
        // The thread saw the deadline pass: abort here too (logs and records ownership_unknown).
        try {
          attempt.checkOwnership();
        } catch {
          // refused, as expected
        }
        break;
    }
  }

  function invoke(op: RunRequest['op'], inv: ToolInvocation): Promise<unknown> {
    const { tool, workflow, input, ctx, attempt } = inv;
    if (closed) return Promise.reject(new TransientError('the thread runner is closed', { code: 'thread_runner_closed' }));
    if (!workflow.sourceFile) return Promise.reject(new PermanentError(noSourceMessage(workflow, tool), { code: 'thread_source_unknown' }));
    const shared = new SharedArrayBuffer(SHARED_BYTES);
    const views = sharedViews(shared);
    Atomics.store(views.deadlineUs, 0, absoluteMicros(attempt.confirmedUntil));
    const t = acquire();
    const id = ++nextId;

    return new Promise<unknown>((resolve, reject) => {
      let graceTimer: NodeJS.Timeout | null = null;
      let offFinal = () => {};
      const offConfirm = attempt.onConfirm((confirmedUntil) => Atomics.store(views.deadlineUs, 0, absoluteMicros(confirmedUntil)));
      // ownership_unknown informs the tool; the abort that ends the attempt (first or later) also starts the grace.
      const onAbort = () => {
        if (attempt.finalReason === null) informThread(t, id, attempt.signal.reason as AttemptAbortedError, views.abort);
      };
      const onFinal = (err: AttemptAbortedError) => {
        informThread(t, id, err, views.abort);
        graceTimer = terminateAfterGrace(t, id, attempt, err.reason);
      };
      const job: Job = {
        id,
        inv,
        settle(ok, value) {
          offConfirm();
          offFinal();
          attempt.signal.removeEventListener('abort', onAbort);
          if (graceTimer) clearTimeout(graceTimer);
          if (ok) resolve(value);
          else reject(value);
        },
      };
      t.job = job;
      const req: RunRequest = {
        type: 'run',
        id,
        op,
        sourceFile: workflow.sourceFile!,
        workflow: workflow.name,
        workflowHash: workflow.hash,
        tool: tool.name,
        input,
        logLevel: ctx.log.level,
        shared,
        ctx: {
          fence: ctx.fence,
          idempotencyKey: ctx.idempotencyKey,
          attempt: ctx.attempt,
          runId: ctx.runId,
          stageId: ctx.stageId,
          ...(ctx.traceparent ? { traceparent: ctx.traceparent } : {}),
        },
      };
      try {
        post(t, req);
      } catch (err) {
        // The input did not survive structured clone (it passed zod, so it is not JSON data).
        t.job = null;
        job.settle(
          false,
          new PermanentError(`input of ${tool.name} cannot cross to its thread: ${(err as Error).message}`, { code: 'invalid_input' }),
        );
        release(t);
        return;
      }
      if (attempt.signal.aborted) onAbort();
      else attempt.signal.addEventListener('abort', onAbort, { once: true });
      offFinal = attempt.onFinal(onFinal);
    });
  }

  function post(t: ToolThread, m: ToThread): void {
    t.worker.postMessage(m);
  }

  /**
   * Tells the thread why its attempt was aborted: the code goes to the shared memory first
   * (beginEffect reads it at once, even while the thread's loop is busy; a later final reason
   * replaces ownership_unknown there), then a message aborts the thread's signal (a signal
   * aborts once: after ownership_unknown it keeps that reason).
   */
  function informThread(t: ToolThread, id: number, err: AttemptAbortedError, abortCode: Int32Array): void {
    Atomics.store(abortCode, 0, abortCodeOf(err.reason));
    if (t.dead || t.job?.id !== id) return;
    try {
      const details = JSON.parse(JSON.stringify(err.details ?? {})) as Record<string, unknown>;
      post(t, { type: 'abort', id, reason: err.reason, message: err.message, details });
    } catch {
      post(t, { type: 'abort', id, reason: err.reason, message: `attempt aborted: ${err.reason}`, details: {} });
    }
  }

  /** The attempt ended for good: a tool that has not wound down after the grace loses its thread. */
  function terminateAfterGrace(t: ToolThread, id: number, attempt: Attempt, reason: string): NodeJS.Timeout {
    const timer = setTimeout(() => {
      if (t.job?.id !== id || t.dead) return;
      logger.warn(
        {
          event: 'tool_thread_terminated',
          threadId: t.worker.threadId,
          runId: attempt.stage.runId,
          stageId: attempt.stage.id,
          fence: attempt.stage.fence,
          reason,
        },
        'the tool did not stop within the grace after its attempt was aborted: terminating its thread',
      );
      void terminate(t, `the attempt was aborted (${reason}) and the tool did not stop within ${graceMs} ms`);
    }, graceMs);
    timer.unref();
    return timer;
  }

  return {
    run: (inv) => invoke('run', inv),
    reconcile: (inv) => invoke('reconcile', inv) as Promise<{ done: true; output: unknown } | { done: false }>,
    stats: () => ({ threads: threads.size, busy: [...threads].filter((t) => t.job !== null).length }),
    async close() {
      closed = true;
      const all = [...threads];
      idle.length = 0;
      await Promise.all(all.map((t) => terminate(t, 'the runner is closed')));
    },
  };
}
