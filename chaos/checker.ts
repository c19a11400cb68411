import { canTransition, TERMINAL_RUN_STATES, TERMINAL_STAGE_STATES } from '../src/planner/states.js';
import type { CheckConfig, FaultKind, FaultRecord, History, StageLogRow } from './history.js';
import { checkGraph, type GraphStats } from './checker-graph.js';
import { checkWaits, type WaitStats } from './checker-waits.js';
import { reclaimSamples, type ReclaimSample } from './reclaim.js';
import { byStage, isClaim, type LeaseInterval, leaseIntervals, overLimit, stageOfFence as stagesOfFences } from './leases.js';

export { type LeaseInterval, leaseIntervals } from './leases.js';

/**
 * The invariant checker (Jepsen's method: the history is recorded while faults happen, the
 * invariants are checked afterwards over all of it). A pure function of the history: every
 * violation names its invariant and carries the rows that prove it.
 */

export const INVARIANTS = [
  /** Every accepted submit reached a terminal state within the bound after the last fault. */
  'lost_run',
  /** One idempotency key of a submit always answered the same run. */
  'duplicate_run',
  /** At most one applied effect per idempotency key, and exactly one for a succeeded effect stage. */
  'duplicate_effect',
  'missing_effect',
  /** No effect accepted with a fence lower than one already seen for its key. */
  'stale_write',
  /** A stage's fences strictly increase, and no fence is handed out twice. */
  'fence_order',
  /** Only transitions of the state table (src/planner/states.ts). */
  'illegal_transition',
  /** A new owner never claims before the old lease ended by the database clock. */
  'claim_before_lease_end',
  /** Nothing is claimed in a cancelled run after its cancel. */
  'claim_after_cancel',
  /** Per-key and per-class limits, from the lease intervals. */
  'limit_exceeded',
  /** No run waits behind another tenant's backlog beyond the stated bound. */
  'tenant_wait',
  /** A run submitted for a version ran that version's code (rolling deploy). */
  'wrong_version',
  /** An engine write on a running stage by its owner (extend, finish, retry, release) after its lease had ended. */
  'stale_engine_write',
  /** Every receiver request maps to a stage by its fence; one key per stage, at most one applied effect per stage. */
  'effect_per_stage',
  /** ratchet.events agrees with the trigger log: each claim has its event with its fence; no event of an unknown run. */
  'events_mismatch',
  /** A failed run whose error is not the soak's deliberate failure. */
  'unexpected_failure',
  /** The run graph (chaos/checker-graph.ts): a stage claimed before every stage it waits for (or a map stage before its items) ended. */
  'join_before_deps',
  /** More items of one map stage leased at once than its step's maxParallel (from the lease intervals). */
  'map_parallel_exceeded',
  /** A run became terminal while a child run it started was not. */
  'child_outlived_parent',
  /** A terminal run with a stage that never ended. */
  'stage_outlived_run',
  /** Waits (chaos/checker-waits.ts): an effect of a gated tool with no approval before it. */
  'gated_effect_without_approval',
  /** More applied effects of a gated stage than approvals of it. */
  'effects_per_approval',
  /** The soak did not exercise what its checks need (a fault kind, a limit, a flood, a stale fence...), or an injection failed. */
  'coverage',
] as const;
export type Invariant = (typeof INVARIANTS)[number];

export interface Violation {
  invariant: Invariant;
  message: string;
  evidence: unknown;
}

export interface CheckResult {
  ok: boolean;
  violations: Violation[];
  /** Violations per invariant (all invariants listed, zeros included). */
  counts: Record<Invariant, number>;
  stats: CheckStats;
}

export interface CheckStats {
  submits: number;
  accepted: number;
  duplicateSubmits: number;
  runsByState: Record<string, number>;
  completed: number;
  faultsByKind: Partial<Record<FaultKind, number>>;
  /** Reclaim latency after a SIGKILL: kill -> the next claim of each stage the dead worker held. */
  reclaimAfterKillMs: { count: number; p50: number | null; p99: number | null; max: number | null };
  /**
   * The goal's measure: kill -> reclaim minus the stage's own lease (issue 13: within the lease plus
   * one second at p99; a $control stage's lease is 30 s, the soak's tools' 3 s).
   */
  reclaimBeyondLeaseMs: { count: number; p50: number | null; p99: number | null; max: number | null };
  /** Where the reclaim time went: the lease left after the kill, the wait after it ended, and the samples furthest past their lease. */
  reclaimBreakdown: {
    leaseLeftMs: { count: number; p50: number | null; p99: number | null; max: number | null };
    afterLeaseMs: { count: number; p50: number | null; p99: number | null; max: number | null };
    slowest: ReclaimSample[];
  };
  /** Due -> claim of stages of tenants that were not flooding (ms). */
  tenantWaitMs: { count: number; p50: number | null; p99: number | null; max: number | null };
  floodWaitMs: { count: number; p50: number | null; p99: number | null; max: number | null };
  leases: number;
  reclaims: number;
  effectsApplied: number;
  receiverRequests: number;
  receiverVerdicts: Record<string, number>;
  duplicates: number;
  staleWrites: number;
  /** Of which: engine writes by a stage's owner after its lease ended (the trigger log). */
  staleEngineWrites: number;
  lostRuns: number;
  limitViolations: number;
  /** Peak live leases per limited group (class:<c>, key:<k>) and its limit. */
  peakConcurrency: Record<string, { peak: number; limit: number }>;
  /** Small-tenant waits (due -> claim) that overlapped a flood window. */
  tenantWaitsInFlood: number;
  /** Time to terminal after max(submit, last fault end), per run. */
  timeToTerminalMs: { count: number; p50: number | null; p99: number | null; max: number | null };
  /** Runs of version 1 that finished after the rolling deploy began. */
  v1FinishedAfterDeploy: number;
  /** Event counts of ratchet.events by type (those the soak reports). */
  events: { total: number; resultRejected: number; ownershipUnknown: number; claimEvents: number } | null;
  /** Failed runs: deliberate (the flaky tool) and not. */
  failedRuns: { deliberate: number; unexpected: number };
  /** The run graph's checks: joins checked, map peaks, child runs (chaos/checker-graph.ts). */
  graph: GraphStats;
  /** Waits: gated stages, approvals, rejections, signals received (chaos/checker-waits.ts). */
  waits: WaitStats;
}

/** Initial states a writer may insert. */
const INITIAL = { stage: ['pending', 'queued'], run: ['queued'] } as const;
const MAX_EVIDENCE = 5;
type LedgerRowLike = History['ledger'][number];
const iso = (t: number | null) => (t === null ? 'null' : new Date(t).toISOString());
/** Guard verdicts after which the guard holds the request's fence for its key (src/receiver/fence-guard.ts). */
const RECORDS_FENCE = new Set(['applied', 'not_stored']);
/** What a late lower fence may be answered: refused on its fence, or the done effect's stored answer. */
const REFUSED_LATE = new Set(['stale_fence', 'replayed']);

/** The held request of a late_request fault: its fields, or (older histories) its detail `<key> fence <n> released late...`. */
export function lateRequestOf(f: FaultRecord): { key: string; fence: string } | null {
  if (f.key !== undefined && f.fence !== undefined) return { key: f.key, fence: f.fence };
  const m = /^(\S+) fence (\d+) released late/.exec(f.detail ?? '');
  return m ? { key: m[1]!, fence: m[2]! } : null;
}

export function quantile(sorted: number[], q: number): number | null {
  if (sorted.length === 0) return null;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
  return sorted[i]!;
}

function summary(values: number[]) {
  const s = [...values].sort((a, b) => a - b);
  return { count: s.length, p50: quantile(s, 0.5), p99: quantile(s, 0.99), max: s.length ? s[s.length - 1]! : null };
}

/** The process of an owner id (`<worker name>:<pid>:<random>`) or a writer (`<name>` or `<name>:<label>`). */
const processOf = (id: string) => id.split(':')[0]!;

/** Writes on a running stage's fence that are not its owner's: cancels, the startup expiry, the exhausted-attempts sweep. */
function isNonOwnerWrite(r: StageLogRow): boolean {
  if (r.newState === 'cancelled') return true;
  if (r.errorCode === 'attempts_exhausted' && r.newState === 'failed') return true;
  // lease_expired_at_startup (extend.sql.ts): lease_until moved to just before now, state kept.
  if (r.newState === 'running' && r.newLeaseUntil !== null && r.newLeaseUntil < r.txAt) return true;
  return false;
}

/**
 * Cancels of the driver (their run: the fault's runId, or older histories the first word of its
 * detail) whose run's cancel transaction also cancelled a stage that had not ended: a cancel
 * that hit work still to run, not an already-ended run.
 */
export function cancelsWithStagesLeft(h: History): number {
  const ran = new Set(h.faults.filter((f) => f.kind === 'cancel').map((f) => f.runId ?? (f.detail ?? '').split(' ')[0]));
  const cancelTx = new Map<string, string>();
  for (const r of h.runLog) if (ran.has(r.runId) && r.newState === 'cancelled' && r.oldState !== 'cancelled') cancelTx.set(r.runId, r.txid);
  const hit = new Set<string>();
  for (const r of h.stageLog)
    if (
      r.newState === 'cancelled' &&
      r.oldState !== null &&
      !(TERMINAL_STAGE_STATES as string[]).includes(r.oldState) &&
      cancelTx.get(r.runId) === r.txid
    )
      hit.add(r.runId);
  return hit.size;
}

export function check(h: History, cfg: CheckConfig): CheckResult {
  const violations: Violation[] = [];
  const add = (invariant: Invariant, message: string, evidence: unknown) => violations.push({ invariant, message, evidence });
  const runs = new Map(h.runs.map((r) => [r.id, r]));
  /** The trigger log's rows grouped by stage, in write order. */
  const rowsByStage = byStage(h.stageLog);

  // --- lost_run, duplicate_run
  const accepted = h.submits.filter((s) => s.runId !== null);
  const runOfKey = new Map<string, string>();
  for (const s of accepted) {
    const prev = runOfKey.get(s.key);
    if (prev !== undefined && prev !== s.runId)
      add('duplicate_run', `idempotency key ${s.key} answered two runs`, { key: s.key, runs: [prev, s.runId] });
    if (prev === undefined) runOfKey.set(s.key, s.runId!);
  }
  // One new run per key: at most one 202, and none only when an earlier try of the key went unanswered.
  const created = new Map<string, number>();
  for (const s of accepted) created.set(s.key, (created.get(s.key) ?? 0) + (s.status === 202 ? 1 : 0));
  for (const [key, n] of created) {
    const retried = h.submits.some((s) => s.key === key && (s.tries ?? 1) > 1);
    if (n > 1 || (n === 0 && !retried))
      add('duplicate_run', `idempotency key ${key} was answered 202 (a new run) ${n} times`, {
        key,
        submits: h.submits.filter((s) => s.key === key),
      });
  }
  const submittedAt = new Map<string, number>();
  for (const s of accepted) if (!submittedAt.has(s.runId!)) submittedAt.set(s.runId!, s.at);
  let lostRuns = 0;
  // A keyed run also waits for its key's backlog: at most `limit` of a key run at once, so a run
  // starts its clock no earlier than the end of the run `limit` places before it (in end order).
  const keyOfRun = new Map<string, { key: string; limit: number }>();
  for (const r of h.stageLog)
    if (r.concurrencyKey !== null && r.concurrencyLimit !== null && r.itemIndex == null)
      keyOfRun.set(r.runId, { key: r.concurrencyKey, limit: r.concurrencyLimit });
  const keyBacklog = new Map<string, number>();
  const byKey = new Map<string, { id: string; end: number; limit: number }[]>();
  for (const [id, k] of keyOfRun) {
    const end = runs.get(id)?.finishedAt;
    if (end == null) continue;
    byKey.set(k.key, [...(byKey.get(k.key) ?? []), { id, end, limit: k.limit }]);
  }
  for (const list of byKey.values()) {
    list.sort((a, b) => a.end - b.end);
    list.forEach((r, i) => {
      if (i >= r.limit) keyBacklog.set(r.id, list[i - r.limit]!.end);
    });
  }
  const clockStart = (id: string, at: number) => Math.max(at, h.lastFaultEndAt, keyBacklog.get(id) ?? -Infinity);
  // Every run the API lists (the driver's or not, e.g. one whose 202 was lost) is terminal.
  for (const run of h.runs) {
    if (submittedAt.has(run.id) || (TERMINAL_RUN_STATES as string[]).includes(run.state)) continue;
    lostRuns++;
    add('lost_run', `run ${run.id} (${run.workflow}), listed by the API but never answered to a submit, is still ${run.state}`, { run });
  }
  const toTerminal: number[] = [];
  for (const [id, at] of submittedAt) {
    const run = runs.get(id);
    const bound = clockStart(id, at) + cfg.terminalBoundMs;
    if (!run) {
      lostRuns++;
      add('lost_run', `accepted run ${id} is unknown to the API at the end`, { id, submittedAt: at });
    } else if (!(TERMINAL_RUN_STATES as string[]).includes(run.state)) {
      lostRuns++;
      const stages = h.stageLog.filter((r) => r.runId === id).slice(-10);
      add('lost_run', `run ${id} (${run.workflow}) is still ${run.state} ${h.endedAt - h.lastFaultEndAt} ms after the last fault`, {
        run,
        lastStageWrites: stages,
      });
    } else if (run.finishedAt !== null && run.finishedAt > bound) {
      toTerminal.push(run.finishedAt - clockStart(id, at));
      lostRuns++;
      add('lost_run', `run ${id} (${run.workflow}) became ${run.state} ${run.finishedAt - bound} ms past its bound`, { run, bound });
    }
  }

  for (const [id, at] of submittedAt) {
    const run = runs.get(id);
    const base = clockStart(id, at);
    if (run?.finishedAt != null && run.finishedAt >= base && run.finishedAt <= base + cfg.terminalBoundMs)
      toTerminal.push(run.finishedAt - base);
  }

  // --- unexpected_failure: a failed run is the deliberate failure of the flaky tool, or a bug.
  const failedRuns = { deliberate: 0, unexpected: 0 };
  for (const id of submittedAt.keys()) {
    const run = runs.get(id);
    if (run?.state !== 'failed' || cfg.deliberateFailure === undefined) continue;
    const error = JSON.stringify(run.error ?? null);
    if ([cfg.deliberateFailure].flat().some((d) => error.includes(d))) failedRuns.deliberate++;
    else {
      failedRuns.unexpected++;
      add('unexpected_failure', `run ${id} (${run.workflow}) failed with an error that is not the deliberate one`, {
        run,
        lastStageWrites: h.stageLog.filter((r) => r.runId === id).slice(-6),
      });
    }
  }

  // --- duplicate_effect, missing_effect
  const effectsPerKey = new Map<string, typeof h.effects>();
  for (const e of h.effects) effectsPerKey.set(e.key, [...(effectsPerKey.get(e.key) ?? []), e]);
  let duplicates = 0;
  for (const [key, list] of effectsPerKey) {
    if (list.length > 1) {
      duplicates++;
      add('duplicate_effect', `key ${key} has ${list.length} applied effects`, {
        key,
        effects: list,
        requests: h.ledger.filter((l) => l.key === key),
      });
    }
  }
  // The receiver answered `applied` twice for one key: two effects as far as any caller can tell,
  // even if its table kept one (a commit it acknowledged and then lost).
  const appliedAnswers = new Map<string, number>();
  for (const l of h.ledger) if (l.verdict === 'applied') appliedAnswers.set(l.key, (appliedAnswers.get(l.key) ?? 0) + 1);
  for (const [key, n] of appliedAnswers) {
    if (n > 1 && (effectsPerKey.get(key)?.length ?? 0) <= 1) {
      duplicates++;
      add('duplicate_effect', `key ${key} was answered applied ${n} times`, {
        key,
        effects: effectsPerKey.get(key) ?? [],
        requests: h.ledger.filter((l) => l.key === key),
      });
    }
  }
  // --- effect_per_stage, missing_effect: each request and effect mapped to its stage by its
  // fence (fences are unique, fence_order checks it), never through the tool's own output.
  const stageOfFence = stagesOfFences(h.stageLog);
  const perStage = new Map<string, { keys: Set<string>; applied: LedgerRowLike[]; effects: typeof h.effects; requests: LedgerRowLike[] }>();
  const stageEntry = (id: string) => {
    let e = perStage.get(id);
    if (!e) perStage.set(id, (e = { keys: new Set(), applied: [], effects: [], requests: [] }));
    return e;
  };
  for (const l of h.ledger) {
    const stageId = stageOfFence.get(l.fence);
    if (stageId === undefined) {
      add('effect_per_stage', `receiver request ${l.seq} (key ${l.key}) carries fence ${l.fence} that no stage was given`, { request: l });
      continue;
    }
    const e = stageEntry(stageId);
    e.keys.add(l.key);
    e.requests.push(l);
    if (l.verdict === 'applied') e.applied.push(l);
  }
  for (const ef of h.effects) {
    const stageId = stageOfFence.get(ef.fence);
    if (stageId === undefined)
      add('effect_per_stage', `effect of key ${ef.key} has fence ${ef.fence} that no stage was given`, { effect: ef });
    else stageEntry(stageId).effects.push(ef);
  }
  for (const [stageId, e] of perStage) {
    if (e.keys.size > 1)
      add('effect_per_stage', `stage ${stageId} sent ${e.keys.size} idempotency keys: ${[...e.keys].join(', ')}`, {
        stageId,
        requests: e.requests.slice(0, MAX_EVIDENCE * 2),
      });
    if (e.applied.length > 1 || e.effects.length > 1) {
      duplicates++;
      add('effect_per_stage', `stage ${stageId} has ${Math.max(e.applied.length, e.effects.length)} applied effects`, {
        stageId,
        applied: e.applied,
        effects: e.effects,
      });
    }
  }
  // A map stage runs in its item tool's name and class but acts through its items only (the run graph).
  const mapGroups = new Set(h.stageLog.filter((r) => r.itemIndex != null && r.groupSeq != null).map((r) => `${r.runId}:${r.groupSeq}`));
  const mapStages = new Set(
    h.stageLog.filter((r) => r.itemIndex == null && r.seq != null && mapGroups.has(`${r.runId}:${r.seq}`)).map((r) => r.stageId),
  );
  for (const s of h.stages) {
    if (s.state !== 'succeeded' || !cfg.effectTools.includes(s.tool) || mapStages.has(s.id)) continue;
    if ((perStage.get(s.id)?.effects.length ?? 0) === 0) {
      add('missing_effect', `succeeded stage ${s.id} (${s.tool}) has no applied effect under any of its fences`, {
        stage: s,
        requests: perStage.get(s.id)?.requests ?? [],
      });
    }
  }

  // --- stale_write (receiver): no effect applied with a fence lower than one the guard recorded
  // before for its key. The guard records the fence of every request it admits: one applied,
  // and one whose handler answered 5xx (not_stored: the effect undone, the fence kept, the key
  // open; the late request's setup). A 409 in_progress or stale_fence answer, a replay, records nothing.
  let staleWrites = 0;
  const highestSeen = new Map<string, { fence: bigint; seq: number; verdict: string }>();
  const ledgerInOrder = [...h.ledger].sort((a, b) => a.seq - b.seq);
  for (const l of ledgerInOrder) {
    const f = BigInt(l.fence);
    const seen = highestSeen.get(l.key);
    if (l.verdict === 'applied' && seen !== undefined && f < seen.fence) {
      staleWrites++;
      add(
        'stale_write',
        `key ${l.key}: fence ${l.fence} applied after fence ${seen.fence} was admitted (request ${seen.seq}, ${seen.verdict})`,
        { applied: l, requests: h.ledger.filter((x) => x.key === l.key) },
      );
    }
    if (RECORDS_FENCE.has(l.verdict) && (seen === undefined || f > seen.fence))
      highestSeen.set(l.key, { fence: f, seq: l.seq, verdict: l.verdict });
  }
  // Each late_request fault: the held request (its key, its lower fence) arrived after a higher
  // fence was admitted for its key, and every such arrival was refused (stale_fence, or the
  // stored answer replayed once the effect was done); anything else is a stale write.
  for (const fault of h.faults) {
    if (fault.kind !== 'late_request') continue;
    const held = lateRequestOf(fault);
    if (held === null) {
      add('stale_write', `late_request fault at ${iso(fault.at)} does not name its held request`, { fault });
      continue;
    }
    const rows = ledgerInOrder.filter((l) => l.key === held.key);
    const admitted = rows.find((l) => RECORDS_FENCE.has(l.verdict) && BigInt(l.fence) > BigInt(held.fence));
    const late = admitted ? rows.filter((l) => l.fence === held.fence && l.seq > admitted.seq) : [];
    const wrong = late.filter((l) => !REFUSED_LATE.has(l.verdict));
    if (!admitted || late.length === 0 || wrong.length > 0) {
      if (wrong.some((l) => l.verdict === 'applied' || l.verdict === 'not_stored')) staleWrites++;
      add(
        'stale_write',
        !admitted
          ? `late_request ${held.key}: no higher fence than ${held.fence} was admitted for the key`
          : late.length === 0
            ? `late_request ${held.key}: the held request (fence ${held.fence}) never arrived after fence ${admitted.fence} was admitted`
            : `late_request ${held.key}: the late fence ${held.fence} was answered ${wrong.map((l) => l.verdict).join(', ')} ` +
              `after fence ${admitted.fence} was admitted (request ${admitted.seq}), not refused`,
        { fault, admitted: admitted ?? null, late, requests: rows.slice(0, MAX_EVIDENCE * 2) },
      );
    }
  }

  // --- stale_engine_write: every write of a stage's owner on its running fence (extend, finish,
  // retry, release) happened while its lease was live by the writing transaction's clock.
  let staleEngineWrites = 0;
  for (const r of h.stageLog) {
    if (r.op !== 'update' || r.oldState !== 'running' || r.oldFence === null || r.oldFence !== r.newFence) continue;
    if (isNonOwnerWrite(r)) continue;
    if (r.oldLeaseUntil === null || r.oldLeaseUntil <= r.txAt) {
      staleEngineWrites++;
      staleWrites++;
      add(
        'stale_engine_write',
        `stage ${r.stageId}: fence ${r.oldFence} (owner ${r.oldOwner}) wrote running -> ${r.newState} at ${iso(r.txAt)}, ` +
          `its lease ended ${iso(r.oldLeaseUntil)}`,
        { row: r },
      );
    }
  }

  // --- fence_order, illegal_transition, claim_before_lease_end
  const fenceOwner = new Map<string, string>();
  for (const [stageId, rows] of rowsByStage) {
    let highest: bigint | null = null;
    let prev: StageLogRow | null = null;
    for (const r of rows) {
      if (r.op === 'insert') {
        if (!(INITIAL.stage as readonly string[]).includes(r.newState)) {
          add('illegal_transition', `stage ${stageId} inserted as ${r.newState}`, { row: r });
        }
      } else if (r.oldState !== r.newState && !canTransition('stage', r.oldState ?? '', r.newState)) {
        add('illegal_transition', `stage ${stageId}: ${r.oldState} -> ${r.newState}`, { row: r, previous: prev });
      }
      if (r.newFence !== null && r.newFence !== (r.op === 'insert' ? null : r.oldFence)) {
        const f = BigInt(r.newFence);
        if (highest !== null && f <= highest) add('fence_order', `stage ${stageId}: fence ${r.newFence} after ${highest}`, { row: r });
        const other = fenceOwner.get(r.newFence);
        if (other !== undefined && other !== stageId)
          add('fence_order', `fence ${r.newFence} handed to stages ${other} and ${stageId}`, { row: r });
        fenceOwner.set(r.newFence, stageId);
        if (highest === null || f > highest) highest = f;
      }
      // A live lease taken from its owner by requeueing it: running -> queued by another process
      // (the trigger log's writer) before the lease ended; the claim that follows reclaims from
      // queued, which the check below does not see.
      if (r.op === 'update' && r.oldState === 'running' && r.newState === 'queued' && r.writer != null && r.oldOwner !== null) {
        const live = r.oldLeaseUntil === null || r.oldLeaseUntil > r.txAt;
        if (live && processOf(r.writer) !== processOf(r.oldOwner))
          add(
            'claim_before_lease_end',
            `stage ${stageId}: fence ${r.oldFence} (owner ${r.oldOwner}) requeued at ${iso(r.txAt)} by ${r.writer}, ` +
              `its lease live until ${iso(r.oldLeaseUntil)}`,
            { row: r, previous: prev },
          );
      }
      if (isClaim(r) && r.oldState === 'running' && r.op === 'update') {
        if (r.oldLeaseUntil === null || r.oldLeaseUntil >= r.txAt) {
          add(
            'claim_before_lease_end',
            `stage ${stageId}: fence ${r.newFence} (owner ${r.newOwner}) claimed at ${new Date(r.txAt).toISOString()} ` +
              `while fence ${r.oldFence} (owner ${r.oldOwner}) held it until ${iso(r.oldLeaseUntil)}`,
            { row: r, previous: prev },
          );
        }
      }
      prev = r;
    }
  }
  const runRows = new Map<string, typeof h.runLog>();
  for (const r of [...h.runLog].sort((a, b) => a.id - b.id)) runRows.set(r.runId, [...(runRows.get(r.runId) ?? []), r]);
  for (const [runId, rows] of runRows) {
    for (const r of rows) {
      if (
        r.op === 'insert'
          ? !(INITIAL.run as readonly string[]).includes(r.newState)
          : r.oldState !== r.newState && !canTransition('run', r.oldState ?? '', r.newState)
      ) {
        add('illegal_transition', `run ${runId}: ${r.op === 'insert' ? 'inserted as' : `${r.oldState} ->`} ${r.newState}`, { row: r });
      }
    }
  }

  // --- claim_after_cancel: no claim in a run written after the last write of its cancel's transaction
  const lastWriteOfTx = new Map<string, number>();
  for (const r of [...h.stageLog, ...h.runLog]) lastWriteOfTx.set(r.txid, Math.max(lastWriteOfTx.get(r.txid) ?? -Infinity, r.id));
  for (const [runId, rows] of runRows) {
    const cancel = rows.find((r) => r.newState === 'cancelled' && r.oldState !== 'cancelled');
    if (!cancel) continue;
    const after = lastWriteOfTx.get(cancel.txid)!;
    const late = h.stageLog.filter((s) => s.runId === runId && s.id > after && isClaim(s));
    if (late.length)
      add('claim_after_cancel', `run ${runId}: ${late.length} claim(s) after its cancel`, { cancel, claims: late.slice(0, MAX_EVIDENCE) });
  }

  // --- limit_exceeded
  const intervals = leaseIntervals(h.stageLog);
  let limitViolations = 0;
  const groups = new Map<string, { limit: number; ivs: LeaseInterval[] }>();
  for (const iv of intervals) {
    const classLimit = cfg.classLimits[iv.toolClass];
    if (classLimit !== undefined) {
      const g = groups.get(`class:${iv.toolClass}`) ?? { limit: classLimit, ivs: [] };
      g.ivs.push(iv);
      groups.set(`class:${iv.toolClass}`, g);
    }
    if (iv.key !== null && iv.keyLimit !== null) {
      const g = groups.get(`key:${iv.key}`) ?? { limit: iv.keyLimit, ivs: [] };
      g.limit = Math.min(g.limit, iv.keyLimit);
      g.ivs.push(iv);
      groups.set(`key:${iv.key}`, g);
    }
  }
  const peakConcurrency: Record<string, { peak: number; limit: number }> = {};
  for (const [group, g] of groups) {
    const { found: over, peak } = overLimit(g.ivs, g.limit);
    // A map's items hold a key per run and step: their peaks are reported per map step (stats.graph.mapPeak).
    if (!g.ivs.some((iv) => iv.item)) peakConcurrency[group] = { peak, limit: g.limit };
    if (over.length) {
      limitViolations += over.length;
      add('limit_exceeded', `${group}: ${over.length} moment(s) with more than ${g.limit} live leases`, {
        group,
        limit: g.limit,
        first: over.slice(0, MAX_EVIDENCE),
      });
    }
  }

  // --- tenant_wait: due -> claim for keyed stages, outside global faults and their slack
  const globalWindows = h.faults
    .filter((f) => cfg.globalFaultKinds.includes(f.kind))
    .map((f) => [f.at, f.endAt + cfg.globalFaultSlackMs] as const);
  const tenantWaits: number[] = [];
  const floodWaits: number[] = [];
  // A flood's window: from its first submit to the last claim of the flooding tenant's stages after it.
  const floodClaims = h.stageLog.filter((r) => r.concurrencyKey === cfg.floodTenant && isClaim(r)).map((r) => r.at);
  const floodWindows = h.faults
    .filter((f) => f.kind === 'tenant_flood')
    .map((f) => [f.at, Math.max(f.endAt, ...floodClaims.filter((t) => t >= f.at))] as const);
  let tenantWaitsInFlood = 0;
  // Waits of un-keyed stages (no tenant's backlog can hold them): the machine's own queueing at each moment.
  const unkeyed: { due: number; wait: number }[] = [];
  const keyed: { stageId: string; due: { at: number; row: StageLogRow }; claim: StageLogRow }[] = [];
  for (const [stageId, rows] of rowsByStage) {
    let due: { at: number; row: StageLogRow } | null = null;
    for (const r of rows) {
      if (r.newState === 'queued' && (r.op === 'insert' || r.oldState !== 'queued'))
        due = { at: Math.max(r.at, r.availableAt ?? r.at), row: r };
      else if (isClaim(r) && due) {
        if (r.concurrencyKey === null) unkeyed.push({ due: due.at, wait: r.at - due.at });
        else if (r.itemIndex == null) keyed.push({ stageId, due, claim: r }); // a map item waits for its own run's items, by design
        due = null;
      } else if (r.newState !== 'queued') due = null;
    }
  }
  unkeyed.sort((a, b) => a.due - b.due);
  /** p75 wait of un-keyed stages due within half the bound of `t` (0 when there were none). */
  const baseline = (t: number): number => {
    const w = unkeyed.filter((u) => Math.abs(u.due - t) <= cfg.tenantWaitBoundMs / 2).map((u) => u.wait);
    return w.length
      ? quantile(
          w.sort((a, b) => a - b),
          0.75,
        )!
      : 0;
  };
  for (const { stageId, due, claim: r } of keyed) {
    const wait = r.at - due.at;
    const start = due.at;
    const overlapsGlobal = globalWindows.some(([a, b]) => start <= b && r.at >= a);
    if (r.concurrencyKey === cfg.floodTenant) floodWaits.push(wait);
    else if (!overlapsGlobal) {
      tenantWaits.push(wait);
      if (floodWindows.some(([a, b]) => start <= b && r.at >= a)) tenantWaitsInFlood++;
      // Waiting behind a backlog is the wait beyond what stages no key holds back waited at that moment.
      const base = wait > cfg.tenantWaitBoundMs ? baseline(start) : 0;
      if (wait - base > cfg.tenantWaitBoundMs) {
        add(
          'tenant_wait',
          `stage ${stageId} of tenant ${r.concurrencyKey} waited ${Math.round(wait)} ms, ${Math.round(wait - base)} ms more than ` +
            `un-keyed stages due then (bound ${cfg.tenantWaitBoundMs} ms)`,
          { due: due.row, claim: r, unkeyedP75WaitMs: base },
        );
      }
    }
  }

  // --- wrong_version
  for (const [id, version] of Object.entries(h.versions)) {
    const run = runs.get(id);
    if (run && run.state === 'succeeded' && run.resultVersion !== version) {
      add('wrong_version', `run ${id} was submitted for version ${version} and ran version ${String(run.resultVersion)}`, { run });
    }
  }

  // --- events_mismatch: ratchet.events against the trigger log
  let eventStats: CheckStats['events'] = null;
  if (h.events) {
    const known = new Set([...h.runLog.map((r) => r.runId), ...h.runs.map((r) => r.id)]);
    const unknown = h.events.filter((e) => !known.has(e.runId));
    if (unknown.length)
      add('events_mismatch', `${unknown.length} event(s) of runs neither the trigger log nor the API knows`, {
        events: unknown.slice(0, MAX_EVIDENCE),
      });
    const claimEvents = new Map<string, (typeof h.events)[number]>();
    for (const e of h.events)
      if ((e.type === 'job_claimed' || e.type === 'lease_reclaimed') && e.stageId !== null && e.fence !== null)
        claimEvents.set(`${e.stageId}:${e.fence}`, e);
    const claimRows = h.stageLog.filter(isClaim);
    const missing = claimRows.filter((r) => !claimEvents.has(`${r.stageId}:${r.newFence}`));
    if (missing.length)
      add('events_mismatch', `${missing.length} claim(s) in the trigger log without their job_claimed / lease_reclaimed event`, {
        claims: missing.slice(0, MAX_EVIDENCE),
      });
    const claimed = new Set(claimRows.map((r) => `${r.stageId}:${r.newFence}`));
    const orphans = [...claimEvents.entries()].filter(([k]) => !claimed.has(k)).map(([, e]) => e);
    if (orphans.length)
      add('events_mismatch', `${orphans.length} claim event(s) with no claim of that stage and fence in the trigger log`, {
        events: orphans.slice(0, MAX_EVIDENCE),
      });
    eventStats = {
      total: h.events.length,
      resultRejected: h.events.filter((e) => e.type === 'result_rejected').length,
      ownershipUnknown: h.events.filter((e) => e.type === 'ownership_unknown').length,
      claimEvents: claimEvents.size,
    };
  }

  // --- the run graph's invariants (chaos/checker-graph.ts)
  const graph = checkGraph(h, cfg, intervals);
  for (const v of graph.violations) {
    add(v.invariant, v.message, v.evidence);
    if (v.invariant === 'map_parallel_exceeded') limitViolations++;
  }

  // --- waits (chaos/checker-waits.ts)
  const waits = checkWaits(h, cfg);
  for (const v of waits.violations) {
    add(v.invariant, v.message, v.evidence);
    duplicates += v.invariant === 'effects_per_approval' ? 1 : 0;
  }

  // --- coverage: a check that had nothing to catch proves nothing
  const v1FinishedAfterDeploy =
    h.deployStartedAt == null
      ? 0
      : Object.entries(h.versions).filter(([id, v]) => {
          const run = runs.get(id);
          return v === 1 && run?.state === 'succeeded' && run.finishedAt !== null && run.finishedAt > h.deployStartedAt!;
        }).length;
  const faultsByKind: Partial<Record<FaultKind, number>> = {};
  for (const f of h.faults) faultsByKind[f.kind] = (faultsByKind[f.kind] ?? 0) + 1;
  if (cfg.coverage) {
    const cov = cfg.coverage;
    const gaps: string[] = [];
    for (const k of cov.faultKinds) if (!faultsByKind[k]) gaps.push(`no ${k} fault was injected`);
    const failed = h.faults.filter((f) => f.kind === 'injection_failed');
    if (failed.length)
      gaps.push(
        `${failed.length} injection(s) failed: ${failed
          .map((f) => f.detail ?? '')
          .join(' | ')
          .slice(0, 1000)}`,
      );
    if (tenantWaitsInFlood === 0) gaps.push('no small-tenant wait was measured inside a flood window');
    for (const [c, limit] of Object.entries(cov.classLimits === false ? {} : cfg.classLimits)) {
      const peak = peakConcurrency[`class:${c}`]?.peak ?? 0;
      if (peak < limit) gaps.push(`class ${c} peaked at ${peak} live leases, never its limit ${limit}`);
    }
    const floodPeak = peakConcurrency[`key:${cov.floodKey}`]?.peak ?? 0;
    if (floodPeak < cov.floodKeyLimit)
      gaps.push(`key ${cov.floodKey} peaked at ${floodPeak} live leases, never its limit ${cov.floodKeyLimit}`);
    if (cov.faultKinds.includes('rolling_deploy') && v1FinishedAfterDeploy === 0)
      gaps.push('no version-1 run finished after the rolling deploy began');
    if (cov.staleFence && !h.ledger.some((l) => l.verdict === 'stale_fence')) gaps.push('the receiver never answered stale_fence');
    if (cov.faultKinds.includes('cancel') && cancelsWithStagesLeft(h) === 0)
      gaps.push('no cancel hit a run that still had stages to run (its cancel cancelled none)');
    if (cov.graph) {
      const g = graph.stats;
      if (g.joinClaims.fanIn === 0) gaps.push('no claim of a stage waiting for several stages (a join) was checked');
      if (g.joinClaims.mapGathers === 0) gaps.push('no gathering claim of a map stage was checked');
      for (const [name, limit] of Object.entries(cfg.mapLimits ?? {}))
        if ((g.mapPeak[name]?.peak ?? 0) < limit) gaps.push(`map ${name} never had ${limit} items leased at once (its maxParallel)`);
      if (g.childRuns.terminal === 0) gaps.push('no child run ended');
    }
    if (cfg.gatedTools?.length) {
      if (waits.stats.approvals === 0) gaps.push('no gated call was approved');
      if (waits.stats.signals === 0) gaps.push('no signal was received');
    }
    for (const g of gaps) add('coverage', g, { faultsByKind, peakConcurrency, tenantWaitsInFlood, v1FinishedAfterDeploy });
  }

  // --- stats
  const runsByState: Record<string, number> = {};
  for (const id of submittedAt.keys()) {
    const s = runs.get(id)?.state ?? 'unknown';
    runsByState[s] = (runsByState[s] ?? 0) + 1;
  }
  const samples = reclaimSamples(h, intervals, rowsByStage, cfg.defaultLeaseMs ?? 0);
  const reclaim = samples.map((x) => x.ms);
  const verdicts: Record<string, number> = {};
  for (const l of h.ledger) verdicts[l.verdict] = (verdicts[l.verdict] ?? 0) + 1;
  const counts = Object.fromEntries(INVARIANTS.map((i) => [i, 0])) as Record<Invariant, number>;
  for (const v of violations) counts[v.invariant]++;
  return {
    ok: violations.length === 0,
    violations,
    counts,
    stats: {
      submits: h.submits.length,
      accepted: submittedAt.size,
      duplicateSubmits: h.submits.filter((s) => s.duplicate).length,
      runsByState,
      completed: [...submittedAt.keys()].filter((id) => (TERMINAL_RUN_STATES as string[]).includes(runs.get(id)?.state ?? '')).length,
      faultsByKind,
      reclaimAfterKillMs: summary(reclaim),
      reclaimBeyondLeaseMs: summary(samples.map((x) => x.beyondLeaseMs)),
      reclaimBreakdown: {
        leaseLeftMs: summary(samples.map((x) => x.leaseLeftMs)),
        afterLeaseMs: summary(samples.map((x) => x.afterLeaseMs)),
        slowest: [...samples].sort((a, b) => b.beyondLeaseMs - a.beyondLeaseMs).slice(0, 5),
      },
      tenantWaitMs: summary(tenantWaits),
      floodWaitMs: summary(floodWaits),
      leases: intervals.length,
      reclaims: h.stageLog.filter((r) => isClaim(r) && r.oldState === 'running').length,
      effectsApplied: h.effects.length,
      receiverRequests: h.ledger.length,
      receiverVerdicts: verdicts,
      duplicates: duplicates + counts.duplicate_run,
      staleWrites,
      staleEngineWrites,
      lostRuns,
      limitViolations,
      peakConcurrency,
      tenantWaitsInFlood,
      timeToTerminalMs: summary(toTerminal),
      v1FinishedAfterDeploy,
      events: eventStats,
      failedRuns,
      graph: graph.stats,
      waits: waits.stats,
    },
  };
}
