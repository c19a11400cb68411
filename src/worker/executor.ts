import type { Logger } from 'pino';
import { InvalidInputError, PermanentError } from '../errors.js';
import type { Registry } from '../definitions/registry.js';
import type { AgentSpec, Tool, ToolClass, ToolContext, Workflow } from '../definitions/types.js';
import { MODEL_STAGE_TOOL } from '../definitions/agent.js';
import { AGENT_SLEEP_TOOL_NAME } from '../definitions/waits.js';
import { buildMessages } from '../agent/messages.js';
import { callModelStreamed } from '../live/tokens.js';
import { onModelAnswer, toPlanRow } from '../dispatcher/agent.js';
import { planAgentRun } from '../planner/agent-run.js';
import {
  applyGroupRule,
  groupFailure,
  onFailure,
  onUnstorable,
  succeededRow,
  terminal,
  type DispatchDeps,
} from '../dispatcher/dispatcher.js';
import { decideAtClaim, type ClaimDecision, type PersistedStage } from '../planner/decide.js';
import { runGraph } from '../planner/graph.js';
import { ITEM_SEQ_STRIDE, stepIndexOf } from '../planner/map.js';
import { fastPathInput } from '../planner/settle.js';
import { plannerFailure } from '../planner/planner-error.js';
import { planStaticRun } from '../planner/plan.js';
import { v7 as uuidv7 } from 'uuid';
import { linearSuccessor } from '../planner/graph.js';
import { checkJson } from '../store/json.js';
import {
  classifyDbError,
  monotonicNow,
  type ClaimedStage,
  type FinishRow,
  type FinishVerdict,
  type GraphStageRow,
  type StageSpec,
  type Store,
  stageRows,
  stageSpecSchema,
} from '../store/index.js';
import { Attempt } from './attempt.js';
import type { EventWriter } from './event-writer.js';
import type { LeaseKeeper } from './lease-keeper.js';
import type { StageReady } from '../transport/transport.js';
import { runGuarded } from './run-guarded.js';
import type { AttemptLabels, Metrics } from '../observability/metrics.js';
import { lazyChild } from '../logger.js';
import { logPayload } from '../observability/log-payload.js';
import { type ModelUsage, recordModelUsage } from '../observability/model-usage.js';
import { assertWithinBudget } from '../agent/budget-gate.js';
import { runUsage } from '../store/usage.js';
import { traceModelCall, traceToolCall } from '../observability/tracing.js';
import { decideGate, offeredTools } from '../planner/waits.js';
import { stageWait } from '../store/approvals.js';
import { beginWait, type BeginWaitResult } from '../store/signals.js';
import { recordWaitEnded } from '../observability/wait-metrics.js';

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
  /** A stage of a run of `definitionHash` became ready (now, or after delayMs): wake whoever serves its class and definition. */
  onQueued(toolClass: string, definitionHash: string, ready: StageReady, delayMs?: number): void;
  /** Expires a run whose deadline the claim found passed (the sweeper's expiry of that one run). */
  expireRun(runId: string): Promise<void>;
  /** The fast path: may this worker claim the next stage (of `nextClass`) in the finish itself? */
  canClaimNext(nextClass: string, currentClass: string): boolean;
  /** The fast path claimed the next stage: run it. */
  onClaimed(stage: ClaimedStage): void;
  random?: () => number;
  metrics: Metrics;
}

/** Attempts that ended on their own terms, for tests and metrics. */
export type AttemptEnd = 'succeeded' | 'failed' | 'retry' | 'rejected' | 'abandoned' | 'unknown' | 'waiting';

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
  // The stage's logger is bound at its first line written: at `warn` most stages write none.
  const log = lazyChild(deps.logger, () => ({
    runId: stage.runId,
    stageId: stage.id,
    fence: stage.fence,
    tool: stage.tool,
    toolClass: stage.toolClass,
    attempt: stage.attempt,
  }));
  if (stage.state === 'failed') {
    log.warn({ event: 'attempts_exhausted' }, 'attempt budget spent: stage and run failed');
    return 'failed';
  }
  if (log.isLevelEnabled('info')) {
    log.info(
      { event: stage.previousState === 'running' ? 'lease_reclaimed' : 'job_claimed', leaseUntil: stage.leaseUntil },
      'stage claimed',
    );
  }
  const labels = stageLabels(deps.registry, stage.toolClass, stage.workflow);
  deps.metrics.stagesClaimed.inc(labels);
  if (stage.previousState === 'running') deps.metrics.reclaims.inc(labels);

  // The claim keeps to the definitions this worker loaded; a stage of another one (a claim that
  // named none) is handed back at once, no attempt spent, for a worker that has its version.
  const workflow = deps.registry.byHash(stage.definitionHash);
  if (!workflow) return handBack(deps, log, stage);
  const step = resolveStep(workflow, stage);
  if (!step) {
    const message =
      `run ${stage.runId} has stage ${stage.seq} (${stage.tool}), which definition ${stage.definitionHash} ` +
      `of workflow "${stage.workflow}" does not have`;
    return settle(deps, log, stage, terminal(stage, { code: 'definition_changed', message }));
  }
  if (stage.runDeadline && stage.runDeadline.getTime() <= stage.dbNow.getTime()) {
    // Claimed before any sweep expired its run: the run is expired now, as a sweep does it (this stage cancelled
    // under this lease's fence, waits `expired`, children cancelled). Failing that, the lease runs out and the next
    // claim or sweep does it.
    try {
      await deps.expireRun(stage.runId);
    } catch (err) {
      log.warn(
        { event: 'expire_failed', err: (err as Error).message },
        'expiring the run past its deadline failed: left to the next sweep',
      );
    }
    return abandoned(log, 'run_deadline');
  }

  const attempt = new Attempt(stage, step.cls.heartbeatMs, deps.events, log, {
    metrics: deps.metrics,
    labels: step.kind === 'model' ? stageLabels(deps.registry, stage.toolClass, stage.workflow, step.agent.model.name) : labels,
    retry: step.kind === 'model' ? step.cls.retry : step.tool.retry,
  });
  deps.keeper.add(attempt);
  const started = monotonicNow();
  // The group rule (continueOnError) of a tool stage's workflow for a failure the finish itself brings (unstorable); a model stage's fails its run.
  const groupOf = step.kind === 'model' ? null : workflow;
  // A model call's usage, once answered, rides on whatever finish the attempt ends with (succeeded, failed, retried):
  // the run's usage sums every finish event that carries it (src/store/usage.sql.ts).
  let answered: { usage?: ModelUsage } = {};
  // (finishData, withEffectKey: module functions, not closures made per stage; tsx, which the bench and
  // `ratchet` from source run under, names each closure a function makes, ~0.6 µs apiece.)
  try {
    let row: FinishRow;
    if (step.kind === 'model') {
      const history = await askStore(attempt, log, 'the run history', () => deps.store.graphStages(stage.runId));
      const decision = decideAtClaim({
        workflow,
        runId: stage.runId,
        runInput: stage.runInput,
        seq: stage.seq,
        stages: history.map(persisted),
      });
      if (decision.kind === 'fail') row = groupFailure(workflow, stage, decision.error, finishData(deps.owner, started, answered));
      else {
        const messages = buildMessages(step.agent, stage.runInput, history, stage.seq);
        // issue 12 budget hook: a run that reached its budget fails here, before the call (src/agent/budget-gate.ts)
        const spent = step.agent.budget ? await askStore(attempt, log, 'the run usage', () => runUsage(deps.store.db, stage.runId)) : null;
        assertWithinBudget(step.agent, spent);
        const call = () =>
          traceModelCall(step.agent.model, stage, () =>
            callModelStreamed(deps.store.db, stage, step.agent.model, messages, offeredTools(step.agent), attempt.signal, stage.timeoutMs),
          );
        const answer = await runGuarded(attempt, call, 'model call', stage.timeoutMs);
        // Counted before the attempt's end is looked at: an answer that came after the lease was lost still spent its tokens.
        answered = recordModelUsage(deps.metrics.registry, step.agent.model, stage.workflow, answer);
        if (isFinal(attempt)) return abandoned(log, attempt.finalReason!);
        row = onModelAnswer(step.agent, stage, answer, history, finishData(deps.owner, started, answered));
      }
    } else if (step.kind === 'agent_tool') {
      // A gated call asks a person first (or runs as approved); the built-in sleep tool waits (issue 10);
      // a workflow tool starts its child run, then takes its result or error (told to the model under tell_model).
      const decision = await decideAgentTool(deps, attempt, log, workflow, step.tool, stage);
      if (decision.kind === 'begin_wait') return await startWait(deps, log, stage, attempt, decision, slot);
      if (decision.kind === 'wait') {
        slot.release();
        return handBack(deps, log, stage);
      }
      // A workflow tool (defineWorkflowTool): its child run starts keyed by this stage, which waits without a lease.
      if (decision.kind === 'start_child') row = childStart(deps, workflow, stage, decision, finishData(deps.owner, started, answered));
      else if (decision.kind === 'fail') row = groupFailure(workflow, stage, decision.error, finishData(deps.owner, started, answered));
      else if (decision.kind === 'done') row = succeededRow(stage, decision.result, finishData(deps.owner, started, answered));
      else if (decision.kind === 'run') {
        const output = await produce(deps, log, workflow, step.tool, stage, decision.input, attempt);
        if (isFinal(attempt)) return abandoned(log, attempt.finalReason!);
        row = succeededRow(stage, output, finishData(deps.owner, started, answered));
      } else throw new Error(`an agent's tool call cannot be decided "${decision.kind}"`);
    } else {
      // The run graph: what this stage does now, decided from the persisted stages of its run.
      const decision = await decideNow(deps, attempt, log, workflow, stage);
      switch (decision.kind) {
        case 'run': {
          const output = await produce(deps, log, workflow, step.tool, stage, decision.input, attempt);
          if (isFinal(attempt)) return abandoned(log, attempt.finalReason!);
          row = await graphSuccess(deps, attempt, log, workflow, stage, output, finishData(deps.owner, started, answered));
          break;
        }
        case 'done':
          row = await graphSuccess(deps, attempt, log, workflow, stage, decision.result, finishData(deps.owner, started, answered));
          break;
        case 'skip':
          row = {
            stageId: stage.id,
            fence: stage.fence,
            outcome: 'skipped',
            data: { ...finishData(deps.owner, started, answered), reason: decision.reason },
          };
          break;
        case 'fail':
          row = groupFailure(workflow, stage, decision.error, finishData(deps.owner, started, answered));
          break;
        case 'expand':
          // A map's first claim: its items inserted with this finish (queued, keyed run:step:i, at most
          // maxParallel leased at once through their concurrency key); the map stage waits without a lease
          // for all of them, and the last item's finish queues it again to gather their outputs in order.
          row = {
            stageId: stage.id,
            fence: stage.fence,
            outcome: 'waiting',
            waitFor: decision.items.length,
            plan: decision.items.map(toPlanRow),
            data: { ...finishData(deps.owner, started, answered), items: decision.items.length },
          };
          break;
        case 'start_child':
          row = childStart(deps, workflow, stage, decision, finishData(deps.owner, started, answered));
          break;
        case 'wait':
          slot.release();
          return handBack(deps, log, stage);
        case 'begin_wait':
          return await startWait(deps, log, stage, attempt, decision, slot);
      }
    }
    if (!row.claimNext) slot.release(); // the tool is done: its slot serves the next claim while this finish commits
    if (deps.events.size > 0) await deps.events.settle();
    attempt.finishing = true;
    return await settle(deps, log, stage, withEffectKey(row, attempt.effectKey), attempt.confirmedUntil, groupOf);
  } catch (err) {
    slot.release(); // the tool settled, or was left behind by the abort that ended the attempt
    if (isFinal(attempt)) return abandoned(log, attempt.finalReason!);
    if (err instanceof StoreUnanswered) {
      log.error({ event: 'finish_unknown', err: err.message }, 'the store did not answer before the finish: outcome unknown');
      return 'unknown';
    }
    log.warn({ event: 'stage_attempt_failed', err: (err as Error).message, code: (err as { code?: unknown }).code }, 'attempt failed');
    const policy = step.kind === 'model' ? { name: 'model', retry: step.cls.retry } : step.tool;
    if (deps.events.size > 0) await deps.events.settle();
    attempt.finishing = true;
    let failed = onFailure(storeReads(deps), policy, stage, err, finishData(deps.owner, started, answered));
    if (failed.outcome === 'failed' && groupOf) failed = applyGroupRule(groupOf, stage, failed);
    return await settle(deps, log, stage, withEffectKey(failed, attempt.effectKey), attempt.confirmedUntil, groupOf);
  } finally {
    const outcome = attempt.abortReason ?? 'finished';
    deps.metrics.stageDuration.observe(withOutcome(attempt.labels, outcome), (monotonicNow() - started) / 1000);
    attempt.end();
    deps.keeper.remove(attempt);
  }
}

/**
 * The metric labels of a stage's attempts, made once per tool class, workflow and model (the
 * registry is immutable; the workflow is `unknown` when it does not have it), frozen and shared
 * by every attempt with them, not made per stage; with each outcome for stage_duration (withOutcome).
 */
const labelSets = new WeakMap<Registry, Map<string, AttemptLabels>>();
const outcomeSets = new WeakMap<AttemptLabels, Map<string, AttemptLabels & { outcome: string }>>();
function stageLabels(registry: Registry, toolClass: string, workflow: string, model?: string): AttemptLabels {
  let sets = labelSets.get(registry);
  if (!sets) labelSets.set(registry, (sets = new Map()));
  const key = model === undefined ? `${toolClass}\u0000${workflow}` : `${toolClass}\u0000${workflow}\u0000${model}`;
  let labels = sets.get(key);
  if (!labels) {
    const known = registry.get(workflow) !== undefined;
    labels = Object.freeze({ tool_class: toolClass, workflow: known ? workflow : 'unknown', ...(model === undefined ? {} : { model }) });
    if (known) sets.set(key, labels); // a name it does not have is not kept: the cache stays as small as the definitions
  }
  return labels;
}
function withOutcome(labels: AttemptLabels, outcome: string): AttemptLabels & { outcome: string } {
  let byOutcome = outcomeSets.get(labels);
  if (!byOutcome) outcomeSets.set(labels, (byOutcome = new Map()));
  let set = byOutcome.get(outcome);
  if (!set) byOutcome.set(outcome, (set = Object.freeze({ ...labels, outcome })));
  return set;
}

/** The event data of an attempt's finish: its duration, its owner, and a model call's usage once answered. */
function finishData(owner: string, started: number, answered: { usage?: ModelUsage }): Record<string, unknown> {
  return { durationMs: Math.round(monotonicNow() - started), owner, ...answered };
}

/** The key the tool derived for its effect, kept on the stage and in the finish event's data. */
function withEffectKey(row: FinishRow, effectKey: string | null): FinishRow {
  return effectKey === null ? row : { ...row, effectKey, data: { ...row.data, effectKey } };
}

type ResolvedStep =
  | { kind: 'static'; tool: Tool; cls: ToolClass }
  | { kind: 'agent_tool'; tool: Tool; cls: ToolClass }
  | { kind: 'model'; agent: AgentSpec; cls: ToolClass };

/** What a stage runs under its run's definition, or null when the definition does not have it. */
function resolveStep(workflow: Workflow, stage: ClaimedStage): ResolvedStep | null {
  if (workflow.agent) {
    if (stage.tool === MODEL_STAGE_TOOL) return { kind: 'model', agent: workflow.agent, cls: workflow.agent.model.class };
    const tool = offeredTools(workflow.agent).find((t) => t.name === stage.tool);
    return tool ? { kind: 'agent_tool', tool, cls: tool.class } : null;
  }
  // A map item's stage belongs to its map step (seq = mapSeq × ITEM_SEQ_STRIDE + index).
  const step = workflow.steps[stepIndexOf(stage.seq)];
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

/**
 * A tool's ctx. `signal` is a getter: the attempt makes its AbortSignal only when the tool reads
 * it (most never do; PERF-NOTES §15). An own enumerable accessor, so a tool's `{ ...ctx }` still
 * copies the signal. `traceparent` is always a key (undefined without a trace context).
 */
function toolContext(
  attempt: Attempt,
  stage: ClaimedStage,
  idempotencyKey: string,
  log: Logger,
  traceparent: string | undefined,
): ToolContext {
  return {
    get signal() {
      return attempt.signal;
    },
    fence: stage.fence,
    idempotencyKey,
    attempt: stage.attempt,
    runId: stage.runId,
    stageId: stage.id,
    heartbeat(details?: unknown) {
      log.debug({ event: 'tool_heartbeat', details }, 'tool heartbeat');
    },
    beginEffect(requestId: string) {
      return attempt.beginEffect(requestId);
    },
    log,
    traceparent,
  };
}

/**
 * reconcile (when an earlier attempt's outcome is unknown), then run; validated output. `input` is
 * the one decided at the claim (the stage's stored one, or computed): passed beside the stage, not
 * as a copy of its ~28 fields per stage.
 */
async function produce(
  deps: ExecutorDeps,
  log: Logger,
  workflow: Workflow,
  tool: Tool,
  stage: ClaimedStage,
  stageInput: unknown,
  attempt: Attempt,
): Promise<unknown> {
  const parsed = tool.input.safeParse(stageInput);
  if (!parsed.success) {
    throw new PermanentError(
      `input of ${tool.name} is invalid: ${parsed.error.issues.map((i) => `${i.path.join('.') || '$'}: ${i.message}`).join('; ')}`,
      { code: 'invalid_input' },
    );
  }
  const input = parsed.data;
  let idempotencyKey = stage.idempotencyKey;
  if (tool.idempotencyKey) {
    try {
      idempotencyKey = tool.idempotencyKey(input);
    } catch (err) {
      throw new PermanentError(`idempotencyKey() of ${tool.name} threw: ${(err as Error).message}`, { code: 'idempotency_key_failed' });
    }
    attempt.effectKey = idempotencyKey;
  }
  const ctx = toolContext(attempt, stage, idempotencyKey, log, undefined);
  const runner = tool.class.isolation === 'thread' && deps.runners.thread ? deps.runners.thread : deps.runners.inline;
  const inv: ToolInvocation = { tool, workflow, input, ctx, attempt };
  // The tool's ctx with its call's traceparent (tracing asks for it): the same literal again, not a copy of ctx.
  const retraced = (_: ToolContext, traceparent: string) => toolContext(attempt, stage, idempotencyKey, log, traceparent);

  if (tool.reconcile && stage.attempt > 1) {
    const unknown =
      stage.previousState === 'running' ||
      (await askStore(attempt, log, 'the effect record', () => deps.store.effectStarted(stage.runId, stage.id, stage.fence)));
    if (unknown) {
      deps.events.push({
        runId: stage.runId,
        stageId: stage.id,
        type: 'outcome_unknown',
        fence: stage.fence,
        attempt: stage.attempt,
        data: { previousFence: stage.previousFence },
      });
      // reconcile has its own time limit (the class's timeout): it never eats into the run's.
      const found = await runGuarded(
        attempt,
        () => traceToolCall(inv, 'reconcile', (ctx) => runner.reconcile({ ...inv, ctx }), retraced),
        `reconcile of ${tool.name}`,
        stage.timeoutMs,
      );
      deps.events.push({
        runId: stage.runId,
        stageId: stage.id,
        type: 'reconciled',
        fence: stage.fence,
        attempt: stage.attempt,
        data: { done: found.done },
      });
      log.info({ event: 'reconciled', done: found.done }, 'reconciled an unknown outcome');
      if (found.done) return validOutput(tool, found.output);
    }
  }
  // issue 12: the tool call's span
  const output = await runGuarded(
    attempt,
    () => traceToolCall(inv, 'run', (ctx) => runner.run({ ...inv, ctx }), retraced),
    tool.name,
    stage.timeoutMs,
  );
  return validOutput(tool, output);
}

function validOutput(tool: Tool, output: unknown): unknown {
  const parsed = tool.output.safeParse(output);
  if (!parsed.success) {
    throw new PermanentError(
      `output of ${tool.name} is invalid: ${parsed.error.issues.map((i) => `${i.path.join('.') || '$'}: ${i.message}`).join('; ')}`,
      { code: 'invalid_output' },
    );
  }
  try {
    checkJson(parsed.data, 'output');
  } catch (err) {
    throw new PermanentError(`output of ${tool.name} is not JSON: ${(err as Error).message}`, { code: 'invalid_output' });
  }
  return parsed.data;
}

function abandoned(log: Logger, reason: string): AttemptEnd {
  log.warn({ event: 'attempt_abandoned', reason }, 'attempt ended without a finish');
  return 'abandoned';
}

/** How long a finish (or a read it needs) that gets no answer is asked again to learn its verdict. */
export const FINISH_RETRY_WINDOW_MS = 60_000;
/** Deadlocks and serialisation failures are asked again at once, at most this many times (then with pauses). */
const MAX_CONFLICT_RETRIES = 10;
/** The longest pause between two asks of a read between the tool and its finish. */
const STORE_READ_MAX_WAIT_MS = 500;

const pause = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The store gave no answer to a read the finish needs, for FINISH_RETRY_WINDOW_MS: the attempt ends without a finish. */
class StoreUnanswered extends Error {}

/**
 * A read the dispatcher needs between the tool and its finish (earlier results, the run's
 * history). A store that does not answer (or a deadlock) is an unknown outcome, never the
 * step's failure: it is asked again, briefly, while the keeper goes on extending the lease.
 * Any other store error (a failover's read-only 25006, an internal XX000, an error with no
 * code) is not asked again but is just as unknown: it ends the attempt as StoreUnanswered,
 * never as the tool's failure (the tool's effect may already have happened). Only the user's
 * input() may fail the step, and stepInput catches that inside `read`.
 */
async function askStore<T>(attempt: Attempt, log: Logger, what: string, read: () => Promise<T>): Promise<T> {
  const until = monotonicNow() + FINISH_RETRY_WINDOW_MS;
  for (let wait = 50; ; wait = Math.min(wait * 2, STORE_READ_MAX_WAIT_MS)) {
    try {
      return await read();
    } catch (err) {
      const kind = classifyDbError(err);
      if (kind !== 'unavailable' && kind !== 'conflict')
        throw new StoreUnanswered(`reading ${what}: ${(err as Error).message}`, { cause: err });
      if (isFinal(attempt) || monotonicNow() + wait > until) throw new StoreUnanswered(`reading ${what}: ${(err as Error).message}`);
      log.warn({ event: 'store_retry', what, err: (err as Error).message }, 'the store did not answer: asking again');
      await pause(wait);
    }
  }
}

function storeReads(deps: ExecutorDeps): DispatchDeps {
  return { random: deps.random };
}

/**
 * Sends the finish and learns its verdict. What an error means decides what follows:
 * - no answer (`unavailable`): the outcome is unknown, never lost; asked again with pauses for
 *   FINISH_RETRY_WINDOW_MS. A try that committed but lost its answer is recognised by the next
 *   (the statement answers `replayed`, with the next stage it claimed, if any, handed back).
 * - a deadlock or serialisation failure (`conflict`): nothing was written; asked again at once.
 * - data the database refuses (`unstorable`, or a row the encoder refuses): asked once more
 *   alone (in a batch it may have been another row's), then the stage fails for good with
 *   `result_not_storable` instead of being asked again until its budget is spent; under the
 *   group rule of `groupOf` (a tool stage's workflow), as every failure for good: continueOnError
 *   keeps it as a value.
 */
async function settle(
  deps: ExecutorDeps,
  log: Logger,
  stage: ClaimedStage,
  row: FinishRow,
  confirmedUntil = stage.confirmedUntil,
  groupOf: Workflow | null = null,
): Promise<AttemptEnd> {
  let verdict: FinishVerdict | undefined;
  const until = monotonicNow() + FINISH_RETRY_WINDOW_MS;
  let alone = false;
  let conflicts = 0;
  let replaced = false;
  for (let wait = 200, tries = 1; verdict === undefined; tries++) {
    try {
      verdict = await deps.finish(row, alone ? 0 : confirmedUntil);
    } catch (err) {
      const refused = err instanceof InvalidInputError;
      const kind = refused ? 'unstorable' : classifyDbError(err);
      const message = (err as Error).message;
      const code = (err as { code?: unknown }).code;
      if (kind === 'conflict' && conflicts++ < MAX_CONFLICT_RETRIES) {
        log.warn({ event: 'finish_conflict', err: message, code, tries }, 'finish rolled back by a conflict: asking again at once');
        alone = true;
        continue;
      }
      if (kind === 'unstorable' && !replaced) {
        if (!alone && !refused) {
          alone = true; // it went in a batch: find out whether it was this row
          continue;
        }
        log.error({ event: 'result_not_storable', err: message, code }, 'the finish cannot be stored: the stage fails');
        const key = row.effectKey ? { effectKey: row.effectKey } : {};
        const spent = row.data?.usage === undefined ? {} : { usage: row.data.usage }; // a model's answer too large to keep still spent its tokens
        const failed = onUnstorable(stage, err, { owner: deps.owner, ...spent, ...key });
        row = { ...(groupOf ? applyGroupRule(groupOf, stage, failed) : failed), ...key };
        replaced = true;
        alone = true;
        continue;
      }
      // The statement errored or did not answer: the outcome is unknown, never lost. Asking
      // again is safe (the finish is fenced, and a committed try is answered as a replay);
      // meanwhile the lease may expire and another attempt reconciles or relies on the key.
      if ((kind !== 'unavailable' && kind !== 'conflict') || monotonicNow() + wait > until) {
        log.error({ event: 'finish_unknown', err: message, kind }, 'finish did not answer: outcome unknown');
        return 'unknown';
      }
      log.warn({ event: 'finish_retry', err: message, tries }, 'finish did not answer: asking again');
      alone = true;
      await pause(wait);
      wait = Math.min(wait * 2, 5000);
    }
  }
  if (!verdict.accepted) {
    deps.metrics.resultsRejected.inc({ tool_class: stage.toolClass, workflow: stage.workflow });
    log.warn({ event: 'result_rejected', outcome: row.outcome }, 'finish rejected: this attempt no longer holds the stage');
    return 'rejected';
  }
  if (verdict.replayed) {
    log.info(
      { event: 'finish_replayed', nextStageId: verdict.nextClaimed?.id },
      'an earlier try of this finish had committed; its answer was lost',
    );
  }
  if (verdict.nextClaimed) deps.onClaimed(verdict.nextClaimed);
  // Every stage this finish made ready (a join reached, a fan-out, an agent's tool calls, a map's items).
  for (const w of verdict.woken) deps.onQueued(w.toolClass, w.definitionHash, { stageId: w.stageId, attempt: 1 });
  if (row.outcome === 'queued') {
    deps.onQueued(stage.toolClass, stage.definitionHash, { stageId: stage.id, attempt: stage.attempt + 1 }, row.retryDelayMs);
  }
  // The result's hash is computed only for a line that is written (a worker at `warn` hashed every result for nothing).
  if (log.isLevelEnabled('info')) {
    log.info(
      {
        event: row.outcome === 'succeeded' ? 'stage_succeeded' : row.outcome === 'queued' ? 'retry_scheduled' : `stage_${row.outcome}`,
        retryDelayMs: row.retryDelayMs,
        run: row.run?.state,
        ...logPayload('result', row.result),
      },
      'stage finished',
    );
  }
  return row.outcome === 'succeeded' ? 'succeeded' : row.outcome === 'queued' ? 'retry' : 'failed';
}

/** A stage of a definition this worker has not loaded: its lease goes back at once, the attempt unspent. */
async function handBack(deps: ExecutorDeps, log: Logger, stage: ClaimedStage): Promise<AttemptEnd> {
  log.warn(
    { event: 'definition_not_loaded', definitionHash: stage.definitionHash, workflow: stage.workflow },
    'stage of a definition this worker lacks: handed back',
  );
  const released = await deps.store.release({ owner: deps.owner, leases: [{ stageId: stage.id, fence: stage.fence }] }).catch(() => []);
  if (released.length > 0) deps.onQueued(stage.toolClass, stage.definitionHash, { stageId: stage.id, attempt: stage.attempt });
  return 'abandoned';
}

/** Runs tools in this process. */
export const inlineRunner: ToolRunner = {
  run: ({ tool, input, ctx }) => tool.run(input, ctx),
  reconcile: ({ tool, input, ctx }) => tool.reconcile!(input, ctx),
};

/** A stage as the planner reads it. */
const persisted = (s: GraphStageRow): PersistedStage => ({ ...s });

/**
 * What a stage of a static workflow does at its claim (planner/decide.ts), from the persisted
 * stages of its run: read only when the decision needs them (a stage that waits for something,
 * a map or a child step). A map item, and a tool stage whose input its finisher already computed
 * (the fast path, or a first stage's input computed at submit), run with that input.
 */
async function decideNow(
  deps: ExecutorDeps,
  attempt: Attempt,
  log: Logger,
  workflow: Workflow,
  stage: ClaimedStage,
): Promise<ClaimDecision> {
  if (stage.seq >= ITEM_SEQ_STRIDE) {
    // A map item of a gated tool asks a person too (its input stored by the expansion).
    const itemTool = workflow.steps[stepIndexOf(stage.seq)]?.tool;
    if (!itemTool?.approval) return { kind: 'run', input: stage.input ?? null };
    const wait = await askStore(attempt, log, 'the stage wait', () => stageWait(deps.store.db, stage.id));
    return decideGate(itemTool, stage.input ?? null, stage.input, wait);
  }
  const node = runGraph(workflow).bySeq.get(stage.seq)!;
  // A gated tool (issue 10) always goes through the decision: approved, or ask a person.
  const gated = node.step.kind === 'tool' && node.step.tool.approval !== undefined;
  if (node.step.kind === 'tool' && stage.input !== null && !gated) return { kind: 'run', input: stage.input };
  const waits = gated || node.step.kind === 'sleep' || node.step.kind === 'signal';
  const read = node.deps.length > 0 || node.step.kind !== 'tool' || gated;
  const stages = read ? await askStore(attempt, log, 'the run graph', () => deps.store.graphStages(stage.runId)) : [];
  const child = node.step.kind === 'workflow' ? await askStore(attempt, log, 'the child run', () => deps.store.childRun(stage.id)) : null;
  const wait = waits ? await askStore(attempt, log, 'the stage wait', () => stageWait(deps.store.db, stage.id)) : null;
  return decideAtClaim({
    workflow,
    runId: stage.runId,
    runInput: stage.runInput,
    seq: stage.seq,
    // The claimed stage's stored input (an approver's edit, a fast-path input) as the claim read it.
    stages: stages.map((s) => (s.seq === stage.seq ? { ...persisted(s), input: stage.input } : persisted(s))),
    child,
    now: stage.dbNow,
    wait,
  });
}

/**
 * An agent's tool call at its claim: an ungated call runs with its stored input (no read); a
 * gated one (approved, or ask a person) and the built-in sleep tool are decided from the
 * stage's waits row, a workflow tool from its child run, once started (src/planner/decide.ts).
 */
async function decideAgentTool(
  deps: ExecutorDeps,
  attempt: Attempt,
  log: Logger,
  workflow: Workflow,
  tool: Tool,
  stage: ClaimedStage,
): Promise<ClaimDecision> {
  if (tool.childWorkflow) {
    const child = await askStore(attempt, log, 'the child run', () => deps.store.childRun(stage.id));
    return decideAtClaim({ workflow, runId: stage.runId, runInput: stage.runInput, seq: stage.seq, stages: [selfOf(stage)], child });
  }
  if (!tool.approval && tool.name !== AGENT_SLEEP_TOOL_NAME) return { kind: 'run', input: stage.input ?? null };
  const wait = await askStore(attempt, log, 'the stage wait', () => stageWait(deps.store.db, stage.id));
  return decideAtClaim({
    workflow,
    runId: stage.runId,
    runInput: stage.runInput,
    seq: stage.seq,
    stages: [selfOf(stage)],
    now: stage.dbNow,
    wait,
  });
}

/** The claimed stage as the planner reads it (an agent's tool call is decided from itself alone). */
function selfOf(stage: ClaimedStage): PersistedStage {
  return {
    seq: stage.seq,
    name: stage.name,
    state: 'running',
    result: null,
    error: stage.error ?? null,
    itemIndex: null,
    groupSeq: null,
    input: stage.input ?? null,
    tool: stage.tool,
  };
}

/** How long beginWait is asked again when the database does not answer. */
const BEGIN_WAIT_RETRY_WINDOW_MS = FINISH_RETRY_WINDOW_MS;

/**
 * The claim decided a wait (issue 10): the stage hands back its lease and waits in `waiting` or
 * `awaiting_approval` (src/store/signals.ts beginWait, fenced like a finish), holding nothing; a
 * signal wait that finds a signal kept for it takes it at once and succeeds. No attempt is lost:
 * the waiting stage's budget grows by the attempt this claim spent.
 */
async function startWait(
  deps: ExecutorDeps,
  log: Logger,
  stage: ClaimedStage,
  attempt: Attempt,
  d: Extract<ClaimDecision, { kind: 'begin_wait' }>,
  slot: Slot,
): Promise<AttemptEnd> {
  slot.release();
  if (deps.events.size > 0) await deps.events.settle();
  attempt.finishing = true;
  const until = monotonicNow() + BEGIN_WAIT_RETRY_WINDOW_MS;
  let r: BeginWaitResult | undefined;
  for (let wait = 100, conflicts = 0; r === undefined; ) {
    try {
      r = await beginWait(
        deps.store.db,
        { stageId: stage.id, owner: deps.owner, fence: stage.fence },
        {
          kind: d.wait,
          until: d.until,
          ...(d.signalName !== undefined ? { signalName: d.signalName } : {}),
          ...(d.input !== undefined ? { input: d.input } : {}),
        },
      );
    } catch (err) {
      const kind = classifyDbError(err);
      if (kind === 'conflict' && conflicts++ < MAX_CONFLICT_RETRIES) continue;
      if ((kind !== 'unavailable' && kind !== 'conflict') || monotonicNow() + wait > until) {
        log.error({ event: 'wait_unknown', err: (err as Error).message, kind }, 'starting the wait did not answer: outcome unknown');
        return 'unknown';
      }
      await pause(wait);
      wait = Math.min(wait * 2, 5000);
    }
  }
  if (r.verdict === 'rejected') {
    deps.metrics.resultsRejected.inc({ tool_class: stage.toolClass, workflow: stage.workflow });
    log.warn({ event: 'result_rejected', outcome: 'waiting' }, 'wait refused: this attempt no longer holds the stage');
    return 'rejected';
  }
  if (r.verdict === 'consumed') {
    recordWaitEnded(deps.metrics.registry, 'signal', 'signalled');
    for (const q of r.settled.queued) deps.onQueued(q.toolClass, q.definitionHash, { stageId: q.id, attempt: q.attempt });
    log.info({ event: 'signal_consumed', signalId: r.signalId }, 'a signal kept for the wait was taken: the stage succeeded');
    return 'succeeded';
  }
  log.info({ event: 'wait_started', kind: d.wait, until: r.until }, 'the stage waits, holding no lease');
  return 'waiting';
}

/**
 * A static stage succeeded (a tool's output, or a value decided without one): on a linear stretch
 * (its one successor waits for it alone) the successor's input is computed now, from the persisted
 * results and this fresh one, so the finish can claim it for this worker (the fast path) or queue
 * it ready; a fan-out or a join is left to the finish's join and the successors' own claims.
 */
async function graphSuccess(
  deps: ExecutorDeps,
  attempt: Attempt,
  log: Logger,
  workflow: Workflow,
  stage: ClaimedStage,
  output: unknown,
  data: Record<string, unknown>,
): Promise<FinishRow> {
  const row = succeededRow(stage, output, data);
  if (stage.seq >= ITEM_SEQ_STRIDE) return row;
  // A plain sequence's last step also ends its run explicitly, as it always did: a run written after
  // the upgrade by a submitter of the previous release has no sink counter (the statement ends it once).
  if (!workflow.graph && stage.seq === workflow.steps.length) return { ...row, run: { state: 'succeeded', result: output } };
  const nextSeq = linearSuccessor(workflow, stage.seq);
  const nextStep = nextSeq === null ? undefined : workflow.steps[nextSeq - 1];
  if (nextSeq === null || !nextStep || nextStep.kind !== 'tool') return row;
  let next: { seq: number; input: unknown } | null;
  if (!nextStep.input && !nextStep.when) next = { seq: nextSeq, input: stage.runInput };
  else {
    const stages = await askStore(attempt, log, 'earlier results', () => deps.store.graphStages(stage.runId));
    next = fastPathInput(workflow, { runId: stage.runId, runInput: stage.runInput, seq: stage.seq, stages: stages.map(persisted) }, output);
  }
  // Without an input computed now, the successor is only queued (its claim decides); the seq still names it for a row of the previous release.
  if (!next) return { ...row, next: { seq: nextSeq, input: null } };
  return { ...row, next, ...(deps.canClaimNext(nextStep.tool.class.name, stage.toolClass) ? { claimNext: true } : {}) };
}

/**
 * A child-run step's first claim: the child workflow (a version this worker loaded), its input
 * checked by the child's schema and its plan, sent with a `waiting` finish that inserts the child
 * run keyed by this stage (a second start inserts nothing) and its stages. The stage then waits
 * without a lease; the child's end queues it again and its next claim takes the child's outcome.
 */
function childStart(
  deps: ExecutorDeps,
  workflow: Workflow,
  stage: ClaimedStage,
  decision: Extract<ClaimDecision, { kind: 'start_child' }>,
  data: Record<string, unknown>,
): FinishRow {
  const fail = (code: 'unknown_child_workflow' | 'child_input_invalid', message: string) =>
    groupFailure(workflow, stage, plannerFailure(code, message).error, data);
  let child: Workflow;
  try {
    child = deps.registry.require(decision.workflow.name, decision.workflow.version ?? undefined);
  } catch (err) {
    return fail('unknown_child_workflow', `child workflow ${decision.workflow.name}: ${(err as Error).message}`);
  }
  const parsed = child.input.safeParse(decision.input);
  if (!parsed.success) {
    const detail = parsed.error.issues.map((i) => `${i.path.join('.') || '$'}: ${i.message}`).join('; ');
    return fail('child_input_invalid', `the input of child workflow ${child.name} is invalid: ${detail}`);
  }
  let plan: { stages: StageSpec[]; sinksLeft?: number };
  try {
    plan = child.agent ? { stages: planAgentRun(child) } : planStaticRun(child, parsed.data);
  } catch (err) {
    return fail('child_input_invalid', `child workflow ${child.name} cannot be planned: ${(err as Error).message}`);
  }
  const rows = stageRows(
    plan.stages.map((s) => stageSpecSchema.parse(s)),
    parsed.data,
    'child',
  );
  return {
    stageId: stage.id,
    fence: stage.fence,
    outcome: 'waiting',
    waitFor: 1,
    child: {
      id: uuidv7(),
      workflow: child.name,
      definitionHash: child.hash,
      input: parsed.data ?? null,
      sinksLeft: plan.sinksLeft ?? null,
      deadlineMs: child.deadlineMs,
      stages: rows.map((r) => JSON.parse(JSON.stringify(r)) as Record<string, unknown>),
    },
    data: { ...data, childWorkflow: child.name },
  };
}
