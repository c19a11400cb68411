import { TERMINAL_RUN_STATES, TERMINAL_STAGE_STATES } from '../src/planner/states.js';
import type { CheckConfig, History, RunLogRow, StageLogRow } from './history.js';
import { byStage, isClaim, type LeaseInterval, overLimit } from './leases.js';

/**
 * The invariants the run graph adds (issue 11), over the same recorded history as the rest of
 * the checker (chaos/checker.ts), and pure as it is:
 * - join_before_deps: a stage is claimed only once every stage it waits for (its `deps`) has
 *   ended, and a map stage's gathering claim only once every item it inserted has ended;
 * - map_parallel_exceeded: at most the map step's maxParallel items of one map stage hold a
 *   lease at once (from the lease intervals, grouped by run and map stage, with the limit the
 *   workflow declares, not the key and limit the engine wrote on the items);
 * - child_outlived_parent: whenever a run becomes terminal, every child run it started before is
 *   terminal already (or in the same transaction); and at the end;
 * - stage_outlived_run: at the end, every stage of a terminal run has ended.
 */

export type GraphInvariant = 'join_before_deps' | 'map_parallel_exceeded' | 'child_outlived_parent' | 'stage_outlived_run';

export interface GraphStats {
  /** Claims whose dependencies were checked: all, those waiting for more than one stage, map gathers. */
  joinClaims: { all: number; fanIn: number; mapGathers: number };
  /** Peak live item leases of one map stage, per `<workflow>:<step>`, with its maxParallel. */
  mapPeak: Record<string, { peak: number; limit: number }>;
  /** Child runs seen, and of them terminal at the end. */
  childRuns: { started: number; terminal: number };
}

export interface GraphCheck {
  violations: { invariant: GraphInvariant; message: string; evidence: unknown }[];
  stats: GraphStats;
}

const MAX_EVIDENCE = 5;
/** Dependency states a claim may follow: ended (a failed one is a dependency only under continueOnError). */
const DONE = new Set<string>(TERMINAL_STAGE_STATES);
const TERMINAL_RUN = new Set<string>(TERMINAL_RUN_STATES);

/** The last of `rows` written before `at` (a lower write id) or by its own transaction (a fast-path claim). */
function asOf<T extends { id: number; txid: string }>(rows: T[], at: T | StageLogRow | RunLogRow): T | undefined {
  let last: T | undefined;
  for (const r of rows) if (r.id < at.id || r.txid === at.txid) last = r;
  return last;
}

export function checkGraph(h: History, cfg: CheckConfig, intervals: LeaseInterval[]): GraphCheck {
  const violations: GraphCheck['violations'] = [];
  const add = (invariant: GraphInvariant, message: string, evidence: unknown) => violations.push({ invariant, message, evidence });
  const stages = byStage(h.stageLog);
  /** run -> seq -> stage id */
  const seqOf = new Map<string, Map<number, string>>();
  /** run -> map stage seq -> its item stage ids */
  const itemsOf = new Map<string, Map<number, string[]>>();
  for (const [id, rows] of stages) {
    const first = rows[0]!;
    if (first.seq == null) continue;
    let m = seqOf.get(first.runId);
    if (!m) seqOf.set(first.runId, (m = new Map()));
    m.set(first.seq, id);
    if (first.itemIndex != null && first.groupSeq != null) {
      let g = itemsOf.get(first.runId);
      if (!g) itemsOf.set(first.runId, (g = new Map()));
      g.set(first.groupSeq, [...(g.get(first.groupSeq) ?? []), id]);
    }
  }

  // --- join_before_deps
  const joinClaims = { all: 0, fanIn: 0, mapGathers: 0 };
  for (const [stageId, rows] of stages) {
    const first = rows[0]!;
    const deps = first.deps ?? [];
    const items = first.seq != null ? (itemsOf.get(first.runId)?.get(first.seq) ?? []) : [];
    for (const claim of rows.filter(isClaim)) {
      if (deps.length > 0) {
        joinClaims.all++;
        if (deps.length > 1) joinClaims.fanIn++;
        for (const dep of deps) {
          const depId = seqOf.get(first.runId)?.get(dep);
          const state = depId === undefined ? undefined : asOf(stages.get(depId)!, claim);
          if (!state || !DONE.has(state.newState))
            add(
              'join_before_deps',
              `stage ${stageId} (${first.step ?? '?'}, seq ${first.seq}) claimed with fence ${claim.newFence} while its dependency ` +
                `seq ${dep} was ${state ? state.newState : 'not written yet'}`,
              {
                claim,
                dependency:
                  depId === undefined
                    ? null
                    : stages
                        .get(depId)!
                        .filter((r) => r.id <= claim.id)
                        .slice(-4),
              },
            );
        }
      }
      // A map stage's claim after its items were inserted is the gathering one: every item ended.
      const inserted = items.filter((id) => stages.get(id)![0]!.id < claim.id);
      if (inserted.length > 0) {
        joinClaims.mapGathers++;
        const open = inserted.map((id) => asOf(stages.get(id)!, claim)!).filter((r) => !DONE.has(r.newState));
        if (open.length > 0)
          add(
            'join_before_deps',
            `map stage ${stageId} (${first.step ?? '?'}) claimed with fence ${claim.newFence} while ${open.length} of its ` +
              `${inserted.length} items had not ended`,
            { claim, openItems: open.slice(0, MAX_EVIDENCE) },
          );
      }
    }
  }

  // --- map_parallel_exceeded: per run and map stage, from the lease intervals.
  const workflowOf = new Map<string, string>();
  for (const r of h.runLog) workflowOf.set(r.runId, r.workflow);
  for (const r of h.runs) if (!workflowOf.has(r.id)) workflowOf.set(r.id, r.workflow);
  const groups = new Map<string, { name: string; ivs: LeaseInterval[] }>();
  for (const iv of intervals) {
    if (!iv.item) continue;
    const name = `${workflowOf.get(iv.runId) ?? '?'}:${iv.item.step}`;
    const k = `${iv.runId}:${iv.item.groupSeq}`;
    const g = groups.get(k) ?? { name, ivs: [] };
    g.ivs.push(iv);
    groups.set(k, g);
  }
  const mapPeak: GraphStats['mapPeak'] = {};
  for (const [k, g] of groups) {
    const limit = cfg.mapLimits?.[g.name];
    if (limit === undefined) continue;
    const { found, peak } = overLimit(g.ivs, limit);
    mapPeak[g.name] = { peak: Math.max(peak, mapPeak[g.name]?.peak ?? 0), limit };
    if (found.length)
      add('map_parallel_exceeded', `map ${g.name} of run ${k}: ${found.length} moment(s) with more than ${limit} items leased`, {
        run: k,
        limit,
        first: found.slice(0, MAX_EVIDENCE),
      });
  }

  // --- child_outlived_parent: at each terminal write of a parent, and at the end.
  const runRows = new Map<string, RunLogRow[]>();
  for (const r of [...h.runLog].sort((a, b) => a.id - b.id)) runRows.set(r.runId, [...(runRows.get(r.runId) ?? []), r]);
  const childrenOf = new Map<string, string[]>();
  for (const [id, rows] of runRows) {
    const parent = rows.find((r) => r.parentRunId != null)?.parentRunId;
    if (parent) childrenOf.set(parent, [...(childrenOf.get(parent) ?? []), id]);
  }
  const finalState = new Map(h.runs.map((r) => [r.id, r.state]));
  let childRuns = 0;
  let childTerminal = 0;
  for (const [parent, children] of childrenOf) {
    for (const end of (runRows.get(parent) ?? []).filter((r) => TERMINAL_RUN.has(r.newState) && !TERMINAL_RUN.has(r.oldState ?? ''))) {
      for (const child of children) {
        const rows = runRows.get(child)!;
        if (rows[0]!.id > end.id && rows[0]!.txid !== end.txid) continue; // started after this end (a retried parent)
        const state = asOf(rows, end);
        if (!state || !TERMINAL_RUN.has(state.newState))
          add('child_outlived_parent', `run ${parent} became ${end.newState} while its child run ${child} was ${state?.newState ?? '?'}`, {
            parentEnd: end,
            child: rows.slice(0, MAX_EVIDENCE),
          });
      }
    }
    for (const child of children) {
      childRuns++;
      const c = finalState.get(child);
      if (c !== undefined && TERMINAL_RUN.has(c)) childTerminal++;
      const p = finalState.get(parent);
      if (p !== undefined && TERMINAL_RUN.has(p) && !(c !== undefined && TERMINAL_RUN.has(c)))
        add('child_outlived_parent', `at the end run ${parent} is ${p} and its child run ${child} is ${c ?? 'unknown to the API'}`, {
          parent,
          child,
          childWrites: runRows.get(child)!.slice(-MAX_EVIDENCE),
        });
    }
  }

  // --- stage_outlived_run: at the end (the state read after the drain).
  const open = new Map<string, typeof h.stages>();
  for (const s of h.stages) {
    const run = finalState.get(s.runId);
    if (run === undefined || !TERMINAL_RUN.has(run) || DONE.has(s.state)) continue;
    open.set(s.runId, [...(open.get(s.runId) ?? []), s]);
  }
  for (const [runId, list] of open)
    add('stage_outlived_run', `run ${runId} is ${finalState.get(runId)} with ${list.length} stage(s) not ended`, {
      runId,
      stages: list.slice(0, MAX_EVIDENCE),
      lastWrites: list.slice(0, 2).flatMap((s) => (stages.get(s.id) ?? []).slice(-3)),
    });

  return { violations, stats: { joinClaims, mapPeak, childRuns: { started: childRuns, terminal: childTerminal } } };
}
