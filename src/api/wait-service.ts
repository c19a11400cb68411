import { randomUUID } from 'node:crypto';
import { toolsOf } from '../definitions/agent.js';
import type { Workflow } from '../definitions/types.js';
import type { Ratchet } from '../engine.js';
import { InvalidInputError, NotAwaitingApprovalError, UnknownRunError, UnknownSignalError, UnknownStageError } from '../errors.js';
import { approvedInput, checkSignalPayload, decideRefusal } from '../planner/waits.js';
import { stepIndexOf } from '../planner/map.js';
import { approveStage, listPendingApprovals, rejectStage, type DecisionResult } from '../store/approvals.js';
import { sendSignal } from '../store/signals.js';
import type { Settled } from '../store/waits-settle.js';
import { laneOf } from '../transport/lane.js';
import { processMetrics } from '../observability/metrics.js';
import { recordApprovalDecision, recordWaitEnded } from '../observability/wait-metrics.js';
import type { ApprovalListJson, ApproveBody, DecisionResponse, RejectBody, SignalResponse } from './wait-schemas.js';

/**
 * The wait operations (issue 10) over one Ratchet, in the API's JSON shapes: the HTTP routes
 * (./waits.ts) and the CLI without a server call them. Everything the definition decides (the
 * signal's schema, the tool's input schema, agent or static) is checked here before the store
 * is asked, so bad input is a 4xx with nothing written.
 */
export interface WaitService {
  signal(runId: string, name: string, payload: unknown, opts: { signalId?: string; sentBy: string | null }): Promise<SignalResponse>;
  approve(runId: string, body: ApproveBody & { stageId?: string }, decidedBy: string): Promise<DecisionResponse>;
  reject(runId: string, body: RejectBody & { stageId?: string }, decidedBy: string): Promise<DecisionResponse>;
  approvals(q?: { runId?: string; limit?: number }): Promise<ApprovalListJson>;
}

export function createWaitService(ratchet: Ratchet): WaitService {
  const { store, registry } = ratchet;
  const requireRun = async (id: string) => {
    const run = await store.getRun(id);
    if (!run) throw new UnknownRunError(id);
    return run;
  };
  const definitionOf = (run: { id: string; workflow: string; definitionHash: string }): Workflow => {
    const wf = registry.byHash(run.definitionHash);
    if (!wf) {
      throw new InvalidInputError(
        `this process has not loaded the definition run ${run.id} started with (${run.workflow} ${run.definitionHash}); ` +
          'ask a server that loads it',
        'workflow',
        { reason: 'unknown_workflow', definitionHash: run.definitionHash },
      );
    }
    return wf;
  };
  const notify = (s: Settled) => {
    for (const q of s.queued) ratchet.transport.notify(laneOf(q.toolClass, q.definitionHash), { stageId: q.id, attempt: q.attempt });
  };
  /** The stage a decision is about: the one named, or the run's one stage awaiting approval. */
  const gatedStage = async (runId: string, stageId: string | undefined) => {
    const run = await requireRun(runId);
    let stage;
    if (stageId !== undefined) {
      stage = run.stages.find((s) => s.id === stageId);
      if (!stage) throw new UnknownStageError(stageId);
    } else {
      const waiting = run.stages.filter((s) => s.state === 'awaiting_approval');
      if (waiting.length === 0) throw new NotAwaitingApprovalError(runId, null, 'no stage of this run awaits approval');
      if (waiting.length > 1) {
        throw new NotAwaitingApprovalError(runId, null, `${waiting.length} stages await approval: name one with --stage (stageId)`, {
          stageIds: waiting.map((s) => s.id),
        });
      }
      stage = waiting[0]!;
    }
    const wf = definitionOf(run);
    const tool = toolsOf(wf).find((t) => t.name === stage.tool);
    if (!tool?.approval) throw new NotAwaitingApprovalError(runId, stage.id, `its tool ${stage.tool} has no approval gate`);
    // The step by seq, as the executor and the sweeper find it: a map's item stage (named `refunds[1]`) belongs to its map's step.
    return { run, stage, wf, tool, step: wf.agent ? null : (wf.steps[stepIndexOf(stage.seq)] ?? null) };
  };
  const decided = (d: DecisionResult) => {
    const registry = processMetrics().registry;
    recordWaitEnded(registry, 'approval', d.decision);
    recordApprovalDecision(registry, (d.decidedAt.getTime() - d.since.getTime()) / 1000, d.decision);
  };
  const decisionJson = (d: DecisionResult): DecisionResponse => ({
    runId: d.runId,
    stageId: d.stageId,
    decision: d.decision,
    decidedBy: d.decidedBy,
    actor: d.actor,
    decidedAt: d.decidedAt.toISOString(),
    reason: d.reason,
    inputHash: d.inputHash,
    runEnded: d.settled.runEnded,
  });

  return {
    async signal(runId, name, payload, opts) {
      const run = await requireRun(runId);
      const wf = definitionOf(run);
      const step = wf.steps.find((s) => s.signal?.name === name);
      if (!step?.signal)
        throw new UnknownSignalError(
          runId,
          name,
          wf.steps.flatMap((s) => (s.signal ? [s.signal.name] : [])),
        );
      const checked = checkSignalPayload(step.signal.schema, payload);
      if (!checked.ok) throw new InvalidInputError(checked.message, checked.path, { issues: checked.issues });
      const d = await sendSignal(store.db, {
        runId,
        name,
        signalId: opts.signalId ?? randomUUID(),
        payload: checked.value,
        sentBy: opts.sentBy,
      });
      notify(d.settled);
      if (d.status === 'delivered' && !d.duplicate) recordWaitEnded(processMetrics().registry, 'signal', 'signalled');
      ratchet.logger.info({ event: 'signal_received', runId, signal: name, status: d.status, duplicate: d.duplicate }, 'signal');
      return {
        runId: d.runId,
        name: d.name,
        signalId: d.signalId,
        status: d.status,
        duplicate: d.duplicate,
        stageId: d.stageId,
        receivedAt: d.receivedAt.toISOString(),
      };
    },
    async approve(runId, body, decidedBy) {
      const { stage, tool } = await gatedStage(runId, body.stageId);
      const edited = approvedInput(tool, body.input);
      if (!edited.ok) throw new InvalidInputError(edited.message, edited.path, { issues: edited.issues });
      const d = await approveStage(store.db, {
        runId,
        stageId: stage.id,
        by: { decidedBy, actor: body.by ?? null },
        reason: body.reason ?? null,
        edited: edited.edited ? { input: edited.input, inputHash: edited.inputHash } : null,
      });
      notify(d.settled);
      decided(d);
      ratchet.logger.info({ event: 'approval_granted', runId, stageId: stage.id, decidedBy }, 'approved');
      return decisionJson(d);
    },
    async reject(runId, body, decidedBy) {
      const { stage, tool, wf, step } = await gatedStage(runId, body.stageId);
      // What the refusal does depends on the definition only (agent or static, continueOnError); its error carries the decision's time.
      const refusal = (decidedAt: Date) =>
        decideRefusal(wf, step, tool, {
          outcome: 'rejected',
          decidedBy: body.by ? `${body.by} (${decidedBy})` : decidedBy,
          decidedAt,
          reason: body.reason ?? null,
        });
      const d = await rejectStage(store.db, {
        runId,
        stageId: stage.id,
        by: { decidedBy, actor: body.by ?? null },
        reason: body.reason ?? null,
        asValue: refusal(new Date(0)).kind !== 'fail_run',
        error: (decidedAt) => refusal(decidedAt).error,
      });
      notify(d.settled);
      decided(d);
      ratchet.logger.info({ event: 'approval_rejected', runId, stageId: stage.id, decidedBy }, 'rejected');
      return decisionJson(d);
    },
    async approvals(q = {}) {
      if (q.runId !== undefined) await requireRun(q.runId);
      const rows = await listPendingApprovals(store.db, { ...(q.runId ? { runId: q.runId } : {}), limit: q.limit ?? 100 });
      return {
        approvals: rows.map((r) => ({
          ...r,
          since: r.since.toISOString(),
          timeoutAt: r.timeoutAt?.toISOString() ?? null,
        })),
      };
    },
  };
}
