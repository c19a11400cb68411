/**
 * The recorded history of one chaos soak: what the invariant checker reads. Everything here is
 * plain data (times are epoch milliseconds), so the checker is a pure function testable on
 * synthetic histories, and a failing soak's history can be written out and checked again.
 *
 * Sources:
 * - stageLog / runLog: every INSERT and UPDATE of ratchet.stages / ratchet.runs, written by a
 *   trigger the harness installs on its private database (chaos/history.sql.ts), with the
 *   writing transaction's id, its start (now(), the database clock the lease SQL uses) and the
 *   wall time of the write (clock_timestamp()).
 * - ledger / effects: the fenced receiver's record of every request (arrival order, key,
 *   fence, verdict) and the effects it applied (its own table, written in the guard's transaction).
 * - submits / runs: the API's answers to the driver (ids, duplicate submits) and the final
 *   state of each run read through the API.
 * - faults: what the fault injector did, when, to whom.
 */

export interface StageLogRow {
  /** Write order (a sequence taken by the trigger). Writes to one row are in true order. */
  id: number;
  /** clock_timestamp() of the write. */
  at: number;
  /** now() of the writing transaction (the database clock of the lease statements). */
  txAt: number;
  txid: string;
  op: 'insert' | 'update';
  stageId: string;
  runId: string;
  tool: string;
  toolClass: string;
  concurrencyKey: string | null;
  concurrencyLimit: number | null;
  oldState: string | null;
  newState: string;
  oldFence: string | null;
  newFence: string | null;
  oldOwner: string | null;
  newOwner: string | null;
  oldLeaseUntil: number | null;
  newLeaseUntil: number | null;
  availableAt: number | null;
  attempt: number;
  /** NEW.error->>'code' (absent in histories recorded before it was logged). */
  errorCode?: string | null;
  /**
   * The run graph (issue 11; absent in histories recorded before it was logged): the stage's
   * seq in its run, its step (a map item: its map step), the seqs it waits for, and for a map
   * item its index and its map stage's seq.
   */
  seq?: number | null;
  step?: string | null;
  deps?: number[] | null;
  itemIndex?: number | null;
  groupSeq?: number | null;
  /** The stage's lease length (its class's; absent in histories recorded before it was logged). */
  leaseMs?: number | null;
  /**
   * The writing connection's application_name: a soak worker's name (its owner id begins with
   * it), the API's `chaos-api` (absent in histories recorded before it was logged).
   */
  writer?: string | null;
}

export interface RunLogRow {
  id: number;
  at: number;
  txAt: number;
  txid: string;
  op: 'insert' | 'update';
  runId: string;
  workflow: string;
  oldState: string | null;
  newState: string;
  /** A child run's parent run (absent in histories recorded before it was logged). */
  parentRunId?: string | null;
}

export interface LedgerRow {
  /** Arrival order at the receiver. */
  seq: number;
  arrivedAt: number;
  answeredAt: number | null;
  key: string;
  fence: string;
  worker: string;
  /** The guard's verdict, or `error` when the guard threw (its database went away mid-request). */
  verdict: string;
  status: number | null;
}

export interface EffectRow {
  key: string;
  fence: string;
  at: number;
}

export interface SubmitRecord {
  key: string;
  workflow: string;
  at: number;
  /** The run id the API answered (null: no answer, e.g. the API was down; then it was not accepted). */
  runId: string | null;
  /** 202 new run, 200 same run again (a duplicate), or the error code. */
  status: number | string;
  duplicate: boolean;
  /** Tries of this submit (same key) until it was answered: > 1 when an answer was lost or refused. */
  tries?: number;
  /** Tenant of a keyed workflow (the concurrency key). */
  tenant?: string;
  version?: number;
}

export interface RunFinal {
  id: string;
  workflow: string;
  state: string;
  createdAt: number;
  finishedAt: number | null;
  /** For versioned workflows: the version the run's result says its code ran. */
  resultVersion?: number | null;
  /** The run's error as the API answered it (failed runs). */
  error?: unknown;
}

/** A row of ratchet.events (the engine's own append-only history). */
export interface EventRow {
  id: number;
  runId: string;
  stageId: string | null;
  type: string;
  fence: string | null;
  at: number;
}

export interface StageFinal {
  id: string;
  runId: string;
  tool: string;
  state: string;
  /** The effect key a succeeded effect tool reported in its output. */
  effectKey: string | null;
}

export type FaultKind =
  | 'sigkill'
  | 'sigstop'
  | 'pg_blackhole'
  | 'receiver_cut'
  | 'redis_flushall'
  | 'redis_restart'
  | 'pg_restart'
  | 'loop_block'
  | 'rolling_deploy'
  | 'tenant_flood'
  | 'duplicate_submit'
  | 'cancel'
  | 'retry'
  /** A request held in the worker's link to the receiver until its stage was reclaimed and answered (stale fence). */
  | 'late_request'
  /** The driver's decisions on a gated call and its signals (issue 10), through the API. */
  | 'approve'
  | 'reject'
  | 'signal'
  /** An injection that threw: always a soak failure (a fault that silently did nothing proves nothing). */
  | 'injection_failed';

export interface FaultRecord {
  kind: FaultKind;
  at: number;
  endAt: number;
  /** The worker it hit (name and owner id), when it hit one. */
  worker?: string;
  owner?: string;
  detail?: string;
  /** late_request: the held request's idempotency key and (lower) fence. */
  key?: string;
  fence?: string;
  /** cancel: the run it was sent for. */
  runId?: string;
}

export interface CheckConfig {
  /** Every accepted run is terminal by max(its submit, the last fault's end) + this. */
  terminalBoundMs: number;
  /** A stage of a tenant that is not flooding waits at most this long from due to claim. */
  tenantWaitBoundMs: number;
  /** The tenant that floods its key (its own waits are not bounded). */
  floodTenant: string;
  /** Global concurrency limit per tool class (classes without one are absent). */
  classLimits: Record<string, number>;
  /** Tools whose succeeded stages applied exactly one effect (their output names the key). */
  effectTools: string[];
  /**
   * maxParallel of each map step, by `<workflow>:<step>`: at most this many items of one map
   * stage hold a lease at once (checked from the lease intervals, not from the key the engine
   * gave the items). Absent: maps are not checked.
   */
  mapLimits?: Record<string, number>;
  /** The lease of the soak's tool classes: a stage whose log rows do not name its own (older histories) is taken to have it. */
  defaultLeaseMs?: number;
  /** Faults that stop every worker at once (excluded from the tenant wait bound). */
  globalFaultKinds: FaultKind[];
  /** Slack for a global fault's aftermath (reconnects, backoff) in the tenant wait bound. */
  globalFaultSlackMs: number;
  /**
   * A failed run is fine only when its error contains this text (the deliberate failure of the
   * soak's flaky tool); any other failed run is a violation. Absent: failed runs are not judged.
   */
  deliberateFailure?: string | string[];
  /** Tools behind an approval gate: their effects need an approval before them, one at most per approval. */
  gatedTools?: string[];
  /**
   * What a soak must have exercised, or its checks proved nothing (absent in unit tests of
   * single invariants): every fault kind at least once, small-tenant waits measured inside flood
   * windows, the class and flood-key limits reached, a version-1 run finishing after the
   * rolling deploy began, at least one stale-fence rejection at the receiver.
   */
  coverage?: {
    faultKinds: FaultKind[];
    floodKey: string;
    floodKeyLimit: number;
    staleFence: boolean;
    /**
     * Require every class limit to be reached (default true). A short soak (the CI's 40 s regression seed) may not
     * load the limited class up to its limit by chance; the soak asks it from runs of 120 s and more.
     */
    classLimits?: boolean;
    /** The run graph was exercised: a join and a map gather checked, each map at its maxParallel, a child run ended. */
    graph?: boolean;
  };
}

export interface History {
  seed: number;
  startedAt: number;
  /** When the last fault ended (faults stop at the end of the duration). */
  lastFaultEndAt: number;
  /** When the driver stopped waiting for runs to end. */
  endedAt: number;
  stageLog: StageLogRow[];
  runLog: RunLogRow[];
  ledger: LedgerRow[];
  effects: EffectRow[];
  submits: SubmitRecord[];
  runs: RunFinal[];
  stages: StageFinal[];
  faults: FaultRecord[];
  /** Runs submitted with an explicit version (rolling deploy): id -> version. */
  versions: Record<string, number>;
  /** ratchet.events (absent in histories recorded before it was read: then not cross-checked). */
  events?: EventRow[];
  /** When the rolling deploy began (absent: no deploy). */
  deployStartedAt?: number | null;
  /** The planned schedule of faults and submits (what the seed decides), for --json. */
  plan?: unknown;
}

/**
 * The part of a history about `runIds` (their stages' writes, requests, effects, submits,
 * events; every fault kept): a failing seed's evidence small enough to keep as a test fixture.
 */
export function trimHistory(h: History, runIds: Iterable<string>): History {
  const keep = new Set(runIds);
  const stageLog = h.stageLog.filter((r) => keep.has(r.runId));
  const fences = new Set(stageLog.flatMap((r) => [r.oldFence, r.newFence]).filter((f): f is string => f !== null));
  return {
    ...h,
    stageLog,
    runLog: h.runLog.filter((r) => keep.has(r.runId)),
    ledger: h.ledger.filter((l) => fences.has(l.fence)),
    effects: h.effects.filter((e) => fences.has(e.fence)),
    submits: h.submits.filter((s) => s.runId !== null && keep.has(s.runId)),
    runs: h.runs.filter((r) => keep.has(r.id)),
    stages: h.stages.filter((s) => keep.has(s.runId)),
    versions: Object.fromEntries(Object.entries(h.versions).filter(([id]) => keep.has(id))),
    ...(h.events ? { events: h.events.filter((e) => keep.has(e.runId)) } : {}),
    plan: undefined,
  };
}
