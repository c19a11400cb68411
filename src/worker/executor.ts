import type { Logger } from 'pino';
import { PermanentError } from '../errors.js';
import type { Registry } from '../definitions/registry.js';
import type { AgentSpec, Tool, ToolClass, ToolContext, Workflow } from '../definitions/types.js';
import { MODEL_STAGE_TOOL } from '../definitions/agent.js';
import { buildMessages } from '../agent/messages.js';
import { callModel } from '../agent/model-client.js';
import { onAgentToolSuccess, onModelAnswer } from '../dispatcher/agent.js';
import { onFailure, onSuccess, terminal } from '../dispatcher/dispatcher.js';
import { toJsonText } from '../store/json.js';
import { DatabaseUnavailableError, monotonicNow, type ClaimedStage, type FinishRow, type FinishVerdict, type Store } from '../store/index.js';
import { Attempt } from './attempt.js';
import type { EventWriter } from './event-writer.js';
import type { LeaseKeeper } from './lease-keeper.js';
import type { StageReady } from '../transport/transport.js';
import { runGuarded } from './run-guarded.js';
import type { Metrics } from '../observability/metrics.js';

export interface ToolInvocation {
  tool: Tool;
  workflow: Workflow;
  input: unknown;
  ctx: ToolContext;
  attempt: Attempt;
}

/** Where a tool's code runs: in this process, or in a worker thread (isolation: 'thread'). */
export interface ToolRunner {
  run(inv: ToolInvocation): Promise<unknown>;
  reconcile(inv: ToolInvocation): Promise<{ done: true; output: unknown } | { done: false }>;
}

export interface ExecutorDeps {
  store: Store;
  keeper: LeaseKeeper;
  events: EventWriter;
  registry: Registry;
  owner: string;
  logger: Logger;
  runners: { inline: ToolRunner; thread?: ToolRunner };
  /** Finishes one row (through the batcher); `confirmedUntil` says whether it may wait to join others. */
  finish(row: FinishRow, confirmedUntil: number): Promise<FinishVerdict>;
  /** A stage became ready (now, or after delayMs): wake whoever serves its class. */
  onQueued(toolClass: string, ready: StageReady, delayMs?: number): void;
  /** The fast path: may this worker claim the next stage (of `nextClass`) in the finish itself? */
  canClaimNext(nextClass: string, currentClass: string): boolean;
  /** The fast path claimed the next stage: run it. */
  onClaimed(stage: ClaimedStage): void;
  random?: () => number;
  metrics: Metrics;
}

/** Attempts that ended on their own terms, for tests and metrics. */
export type AttemptEnd = 'succeeded' | 'failed' | 'retry' | 'rejected' | 'abandoned' | 'unknown';

/**
 * The worker's slot an attempt's tool runs in. It is freed once the tool is done with — it
 * settled, or was left behind by an abort that ended the attempt (a timeout, a lost lease, even
 * after ownership_unknown) — not when the finish commits: a finish retried while the database
 * is away holds no slot. On the fast path the slot passes to the stage the finish claims.
 * release() is idempotent.
 */
export interface Slot {
  release(): void;
}
const NO_SLOT: Slot = { release: () => {} };

/**
 * Runs one claimed stage: checks the run's definition and deadline, reconciles an unknown
 * outcome, validates input, runs the tool under its lease, timeout and signal, validates the
 * output, and finishes — fenced, with the dispatcher's decision in the same statement.
 */
export async function executeStage(deps: ExecutorDeps, stage: ClaimedStage, slot: Slot = NO_SLOT): Promise<AttemptEnd> {
  const log = deps.logger.child({ runId: stage.runId, stageId: stage.id, fence: stage.fence, tool: stage.tool, toolClass: stage.toolClass, attempt: stage.attempt });
  if (stage.state === 'failed') {
    log.warn({ event: 'attempts_exhausted' }, 'attempt budget spent: stage and run failed');
    return 'failed';
  }
  log.info({ event: stage.previousState === 'running' ? 'lease_reclaimed' : 'job_claimed', leaseUntil: stage.leaseUntil }, 'stage claimed');
  const labels = { tool_class: stage.toolClass, workflow: deps.registry.get(stage.workflow) ? stage.workflow : 'unknown' };
  deps.metrics.stagesClaimed.inc(labels);
  if (stage.previousState === 'running') deps.metrics.reclaims.inc(labels);

  const workflow = deps.registry.get(stage.workflow);
  const step = workflow && workflow.hash === stage.definitionHash ? resolveStep(workflow, stage) : null;
  if (!workflow || !step) {
    const message = !workflow
      ? `this worker does not know workflow "${stage.workflow}"`
      : `run ${stage.runId} started with definition ${stage.definitionHash} of workflow "${stage.workflow}"; this worker has ${workflow.hash}. ` +
        'A changed definition is never mapped onto old stages: resubmit the run, or keep the old definition under another name.';
    return settle(deps, log, stage, terminal(stage, 'failed', 'failed', { code: 'definition_changed', message }));
  }
  if (stage.runDeadline && stage.runDeadline.getTime() <= stage.dbNow.getTime()) {
    return settle(deps, log, stage, terminal(stage, 'cancelled', 'expired', { code: 'run_deadline_exceeded', message: `the run's deadline ${stage.runDeadline.toISOString()} passed` }));
  }

  const attempt = new Attempt(stage, step.cls.heartbeatMs, deps.events, log,
    { metrics: deps.metrics, labels: { ...labels, ...(step.kind === 'model' ? { model: step.agent.model.name } : {}) } });
  deps.keeper.add(attempt);
  const started = monotonicNow();
  const data = () => ({ durationMs: Math.round(monotonicNow() - started), owner: deps.owner });
  try {
    let row: FinishRow;
    if (step.kind === 'model') {
      const history = await deps.store.runStages(stage.runId);
      const messages = buildMessages(step.agent, stage.runInput, history, stage.seq);
      const call = () => callModel(step.agent.model, messages, step.agent.tools, attempt.signal, stage.timeoutMs);
      const answer = await runGuarded(attempt, call, 'model call', stage.timeoutMs);
      if (isFinal(attempt)) return abandoned(log, attempt.finalReason!);
      row = onModelAnswer(step.agent, stage, answer, history, data());
    } else {
      const output = await produce(deps, log, workflow, step.tool, stage, attempt);
      if (isFinal(attempt)) return abandoned(log, attempt.finalReason!);
      if (step.kind === 'agent_tool') {
        row = onAgentToolSuccess(stage, output, data());
      } else {
        row = await onSuccess(deps.store, workflow, stage, output, data());
        const nextClass = workflow.steps[stage.seq]?.tool.class.name;
        if (row.next && nextClass && deps.canClaimNext(nextClass, stage.toolClass)) row.claimNext = true;
      }
    }
    if (!row.claimNext) slot.release(); // the tool is done: its slot serves the next claim while this finish commits
    if (deps.events.size > 0) await deps.events.settle();
    attempt.finishing = true;
    return await settle(deps, log, stage, row, attempt.confirmedUntil);
  } catch (err) {
    slot.release(); // the tool settled, or was left behind by the abort that ended the attempt
    if (isFinal(attempt)) return abandoned(log, attempt.finalReason!);
    log.warn({ event: 'stage_attempt_failed', err: (err as Error).message, code: (err as { code?: unknown }).code }, 'attempt failed');
    const policy = step.kind === 'model' ? { name: 'model', retry: step.cls.retry } : step.tool;
    if (deps.events.size > 0) await deps.events.settle();
    attempt.finishing = true;
    const row = onFailure({ stageResults: deps.store.stageResults, random: deps.random }, policy, stage, err, data());
    return await settle(deps, log, stage, row, attempt.confirmedUntil);
  } finally {
    const outcome = attempt.abortReason ?? 'finished';
    deps.metrics.stageDuration.observe({ ...attempt.labels, outcome }, (monotonicNow() - started) / 1000);
    attempt.end();
    deps.keeper.remove(attempt);
  }
}

type ResolvedStep =
  | { kind: 'static'; tool: Tool; cls: ToolClass }
  | { kind: 'agent_tool'; tool: Tool; cls: ToolClass }
  | { kind: 'model'; agent: AgentSpec; cls: ToolClass };

/** What a stage runs under its run's definition, or null when the definition does not have it. */
function resolveStep(workflow: Workflow, stage: ClaimedStage): ResolvedStep | null {
  if (workflow.agent) {
    if (stage.tool === MODEL_STAGE_TOOL) return { kind: 'model', agent: workflow.agent, cls: workflow.agent.model.class };
    const tool = workflow.agent.tools.find((t) => t.name === stage.tool);
    return tool ? { kind: 'agent_tool', tool, cls: tool.class } : null;
  }
  const step = workflow.steps[stage.seq - 1];
  return step && step.tool.name === stage.tool ? { kind: 'static', tool: step.tool, cls: step.tool.class } : null;
}

/**
 * Lost, cancelled, past maxDuration, the run expired, shutting down: the attempt ends without
 * a finish (a timeout ends it with a failure finish) — also when it comes after ownership_unknown.
 */
function isFinal(attempt: Attempt): boolean {
  const reason = attempt.finalReason;
  return reason !== null && reason !== 'timeout';
}

/** reconcile (when an earlier attempt's outcome is unknown), then run; validated output. */
async function produce(deps: ExecutorDeps, log: Logger, workflow: Workflow, tool: Tool, stage: ClaimedStage, attempt: Attempt): Promise<unknown> {
  const parsed = tool.input.safeParse(stage.input);
  if (!parsed.success) {
    throw new PermanentError(`input of ${tool.name} is invalid: ${parsed.error.issues.map((i) => `${i.path.join('.') || '$'}: ${i.message}`).join('; ')}`, { code: 'invalid_input' });
  }
  const input = parsed.data;
  let idempotencyKey = stage.idempotencyKey;
  if (tool.idempotencyKey) {
    try {
      idempotencyKey = tool.idempotencyKey(input);
    } catch (err) {
      throw new PermanentError(`idempotencyKey() of ${tool.name} threw: ${(err as Error).message}`, { code: 'idempotency_key_failed' });
    }
  }
  const ctx: ToolContext = {
    signal: attempt.signal,
    fence: stage.fence,
    idempotencyKey,
    attempt: stage.attempt,
    runId: stage.runId,
    stageId: stage.id,
    heartbeat: (details?: unknown) => log.debug({ event: 'tool_heartbeat', details }, 'tool heartbeat'),
    beginEffect: (requestId: string) => attempt.beginEffect(requestId),
    log,
  };
  const runner = tool.class.isolation === 'thread' && deps.runners.thread ? deps.runners.thread : deps.runners.inline;
  const inv: ToolInvocation = { tool, workflow, input, ctx, attempt };

  if (tool.reconcile && stage.attempt > 1) {
    const unknown = stage.previousState === 'running' || (await deps.store.effectStarted(stage.runId, stage.id, stage.fence));
    if (unknown) {
      deps.events.push({ runId: stage.runId, stageId: stage.id, type: 'outcome_unknown', fence: stage.fence, attempt: stage.attempt, data: { previousFence: stage.previousFence } });
      // reconcile has its own time limit (the class's timeout): it never eats into the run's.
      const found = await runGuarded(attempt, () => runner.reconcile(inv), `reconcile of ${tool.name}`, stage.timeoutMs);
      deps.events.push({ runId: stage.runId, stageId: stage.id, type: 'reconciled', fence: stage.fence, attempt: stage.attempt, data: { done: found.done } });
      log.info({ event: 'reconciled', done: found.done }, 'reconciled an unknown outcome');
      if (found.done) return validOutput(tool, found.output);
    }
  }
  return validOutput(tool, await runGuarded(attempt, () => runner.run(inv), tool.name, stage.timeoutMs));
}

function validOutput(tool: Tool, output: unknown): unknown {
  const parsed = tool.output.safeParse(output);
  if (!parsed.success) {
    throw new PermanentError(`output of ${tool.name} is invalid: ${parsed.error.issues.map((i) => `${i.path.join('.') || '$'}: ${i.message}`).join('; ')}`, { code: 'invalid_output' });
  }
  try {
    toJsonText(parsed.data, 'output');
  } catch (err) {
    throw new PermanentError(`output of ${tool.name} is not JSON: ${(err as Error).message}`, { code: 'invalid_output' });
  }
  return parsed.data;
}

function abandoned(log: Logger, reason: string): AttemptEnd {
  log.warn({ event: 'attempt_abandoned', reason }, 'attempt ended without a finish');
  return 'abandoned';
}

/** How long a finish whose answer was lost is retried to learn its verdict. */
export const FINISH_RETRY_WINDOW_MS = 60_000;

async function settle(deps: ExecutorDeps, log: Logger, stage: ClaimedStage, row: FinishRow, confirmedUntil = stage.confirmedUntil): Promise<AttemptEnd> {
  let verdict;
  const until = monotonicNow() + FINISH_RETRY_WINDOW_MS;
  for (let wait = 200, tries = 1; ; tries++) {
    try {
      verdict = await deps.finish(row, tries === 1 ? confirmedUntil : 0);
      if (tries > 1 && !verdict.accepted && verdict.currentFence === stage.fence && verdict.currentState === row.outcome && row.outcome !== 'queued') {
        // An earlier try committed and only its answer was lost: the row already holds our finish.
        verdict = { ...verdict, accepted: true };
      }
      break;
    } catch (err) {
      // The statement errored or did not answer: the outcome is unknown, never lost. Asking
      // again is safe (the finish is fenced) and tells which it was; meanwhile the lease may
      // expire and another attempt reconciles or relies on the idempotency key.
      if (!(err instanceof DatabaseUnavailableError) || monotonicNow() + wait > until) {
        log.error({ event: 'finish_unknown', err: (err as Error).message }, 'finish did not answer: outcome unknown');
        return 'unknown';
      }
      log.warn({ event: 'finish_retry', err: (err as Error).message, tries }, 'finish did not answer: asking again');
      await new Promise((r) => setTimeout(r, wait));
      wait = Math.min(wait * 2, 5000);
    }
  }
  if (!verdict.accepted) {
    deps.metrics.resultsRejected.inc({ tool_class: stage.toolClass, workflow: stage.workflow });
    log.warn({ event: 'result_rejected', outcome: row.outcome }, 'finish rejected: this attempt no longer holds the stage');
    return 'rejected';
  }
  if (verdict.nextClaimed) deps.onClaimed(verdict.nextClaimed);
  else if (verdict.nextStageId && verdict.nextToolClass) deps.onQueued(verdict.nextToolClass, { stageId: verdict.nextStageId, attempt: 1 });
  if (row.outcome === 'queued') deps.onQueued(stage.toolClass, { stageId: stage.id, attempt: stage.attempt + 1 }, row.retryDelayMs);
  log.info({ event: row.outcome === 'succeeded' ? 'stage_succeeded' : row.outcome === 'queued' ? 'retry_scheduled' : `stage_${row.outcome}`, retryDelayMs: row.retryDelayMs, run: row.run?.state }, 'stage finished');
  return row.outcome === 'succeeded' ? 'succeeded' : row.outcome === 'queued' ? 'retry' : 'failed';
}

/** Runs tools in this process. */
export const inlineRunner: ToolRunner = {
  run: ({ tool, input, ctx }) => tool.run(input, ctx),
  reconcile: ({ tool, input, ctx }) => tool.reconcile!(input, ctx),
};
