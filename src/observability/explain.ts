import type { Registry } from '../definitions/registry.js';
import { mapConcurrencyKey } from '../planner/map.js';
import { TERMINAL_RUN_STATES } from '../planner/states.js';
import type { Store } from '../store/index.js';
import {
  classifyActive,
  classifyNoActiveStage,
  classifyTerminal,
  classifyUnknown,
  classifyWaiting,
  type StageEvidence,
} from './classify.js';
import { DB_NOW_SQL, MAP_LIMIT_SQL, STAGE_EVIDENCE_SQL } from './explain.sql.js';
import { WORKER_SEEN_WITHIN_MS, type Explanation } from './explanation.js';
import { classifyWait } from './classify-waits.js';
import { waitsOf } from '../store/approvals.js';
import type { RunRow } from '../store/index.js';

export interface ExplainDeps {
  store: Store;
  /** The classes' limits (concurrency, rate) and heartbeats, and the versions of hashes, come from the definitions this process loaded. */
  registry?: Pick<Registry, 'toolClasses' | 'byHash'>;
}

/**
 * Why a run is where it is (DESIGN.md "Observability"): running and healthy; queued and why
 * (retry delayed until T, a concurrency or rate limit, no worker serving the class, no worker
 * with the run's version, a backlog ahead); stuck (lease expired, not reclaimed); terminal with
 * its error; unknown id. Reads only, by the database clock; each verdict names its evidence.
 */
export async function explainRun(deps: ExplainDeps, id: string): Promise<Explanation> {
  const run = await deps.store.getRun(id);
  const now = async () => (await deps.store.db.query(DB_NOW_SQL))[0]!.now as Date;
  if (!run) return classifyUnknown(id, await now());
  if (TERMINAL_RUN_STATES.includes(run.state)) return classifyTerminal(run, run.dbNow);
  const stage = run.stages.find((s) => s.state === 'running') ?? run.stages.find((s) => s.state === 'queued');
  if (!stage) {
    // The run graph: a stage waiting without a lease, for its child run (with the child's own verdict) or its map's items.
    const waiting = run.stages.find((s) => s.state === 'waiting');
    if (waiting) {
      const child = run.children?.find((c) => c.parentStageId === waiting.id);
      if (child) {
        const inner = await explainRun(deps, child.id);
        const ev = { kind: 'child' as const, childRunId: child.id, workflow: child.workflow, childState: child.state };
        return classifyWaiting(run, waiting, { ...ev, childVerdict: inner.verdict, childSummary: inner.summary }, run.dbNow);
      }
      if (run.stages.some((s) => s.groupSeq === waiting.seq)) {
        const items = run.stages.filter((s) => s.groupSeq === waiting.seq).map((s) => s.state);
        // maxParallel is the items' concurrency limit (their key run:step); null when the map has none
        const key = mapConcurrencyKey(run.id, waiting.name);
        const [m] = await deps.store.db.query(MAP_LIMIT_SQL, [run.id, waiting.seq, key]);
        const maxParallel = (m?.max_parallel as number | null | undefined) ?? null;
        return classifyWaiting(run, waiting, { kind: 'items', states: items, maxParallel }, run.dbNow);
      }
    }
    // Issue 10: a stage waiting for a signal, a person or a time (ratchet.waits), else no active stage.
    return (await explainWait(deps, run)) ?? classifyNoActiveStage(run, run.dbNow);
  }
  const cls = deps.registry?.toolClasses().find((c) => c.name === stage.toolClass);
  const [r] = await deps.store.db.query(STAGE_EVIDENCE_SQL, [stage.id, WORKER_SEEN_WITHIN_MS, cls?.rateLimit?.perMs ?? 0]);
  if (!r) return classifyNoActiveStage(run, run.dbNow); // the stage row vanished (the run was deleted meanwhile)
  const evidence: StageEvidence = {
    now: r.now as Date,
    concurrencyKey: (r.concurrency_key as string | null) ?? null,
    concurrencyLimit: (r.concurrency_limit as number | null) ?? null,
    workersRecent: r.workers_recent as number,
    definitionHash: r.definition_hash as string,
    version: deps.registry?.byHash(r.definition_hash as string)?.version ?? null,
    workersWithDefinition: r.workers_with_definition as number,
    workerLastSeen: (r.worker_last_seen as Date | null) ?? null,
    classLastHeartbeat: (r.class_last_heartbeat as Date | null) ?? null,
    liveLeases: r.live_leases as number,
    keyLiveLeases: r.key_live_leases as number,
    rateClaims: r.rate_claims as number,
    rateOldest: (r.rate_oldest as Date | null) ?? null,
    backlogAhead: r.backlog_ahead as number,
  };
  return classifyActive(run, stage, evidence, cls);
}

/** A run whose telling stage waits without a lease for a signal, a person or a time (issue 10): its open ratchet.waits row. */
async function explainWait(deps: ExplainDeps, run: RunRow): Promise<Explanation | null> {
  const stage = run.stages.find((s) => s.state === 'awaiting_approval') ?? run.stages.find((s) => s.state === 'waiting');
  if (!stage) return null;
  const w = (await waitsOf(deps.store.db, run.id)).find((x) => x.stageId === stage.id && x.endedAt === null);
  if (!w) return null; // a child run or map items (the run graph's own verdicts), or a wait that just ended
  const step = deps.registry?.byHash(run.definitionHash)?.steps.find((s) => s.name === stage.name);
  return classifyWait(
    run,
    stage,
    {
      kind: w.kind,
      since: w.since,
      until: w.until,
      ...(w.signalName ? { signal: w.signalName } : {}),
      ...(step?.signal ? { onTimeout: step.signal.onTimeout !== undefined, timeoutMs: step.signal.timeoutMs } : {}),
    },
    run.dbNow,
  );
}
