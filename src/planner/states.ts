import { IllegalTransitionError } from '../errors.js';

/**
 * The one table of states and legal transitions. Every writer (the lease SQL, the
 * dispatcher, cancel, retry) asks this table; SQL conditions are built from it.
 *
 * stage: pending (planned, not its turn) -> queued (its turn; available_at may hold a retry
 *   delay) -> running (leased) -> succeeded | failed | cancelled | skipped.
 *   pending -> running is the fast path: the finish of the stage before it queues and claims
 *   it in one statement, for the same worker.
 *   pending -> failed is a next stage whose input could not be computed (its step's input()
 *   threw): it fails with its run, so a retry of the run starts from it.
 *   running -> running is the reclaim of an expired lease (new owner, new fence).
 *   running -> queued is a retry (or a graceful release, or an attempt past maxDuration).
 *   queued -> failed is a claim that finds the attempt budget spent.
 *   failed -> queued is the explicit retry of a failed run from its failed stages;
 *   cancelled -> pending is the same retry re-planning the later stages the failure cancelled;
 *   cancelled -> queued the same for a parallel branch it cancelled that was already due.
 *   failed | cancelled -> waiting is that retry re-attaching a child-run stage to its child run,
 *   retried with it (store/retry-run.ts); queued -> waiting a child run retried alone while the
 *   parent stage its end had queued was not yet claimed: the stage waits for it again.
 *   The run graph (issue 11): running -> skipped is a stage whose `when` was false, or whose
 *   dependencies were all skipped (decided at its claim; it counts as done for the join).
 *   running -> waiting is a stage that holds no lease while it waits: a map stage for its items,
 *   a child-run stage for its child run (later: a signal, a timer). waiting -> queued is the end of
 *   what it waited for (the last item's finish, the child run's end): claimed again, it gathers
 *   the items or takes the child's result. waiting -> cancelled: its run was cancelled or failed.
 *   Waits (issue 10) hold no lease either. `waiting` also carries sleeps and signal waits (the
 *   kind, its start and its time limit are in ratchet.waits, src/store/waits.schema.ts): the
 *   claim of a sleep or signal step decides the wait (running -> waiting, lease released);
 *   waiting -> queued is its timer (the sleep's end, the signal's timeout) found by the sweeper
 *   by the database clock, claimed again to end it (sleep: `{ sleptUntil }`; signal: onTimeout or
 *   signal_timeout); waiting -> succeeded is a signal delivered to the waiting stage, its payload
 *   the output, in the transaction that queues what follows.
 *   `awaiting_approval` is a gated tool call waiting for a person: running -> awaiting_approval
 *   is the claim of a static gated step (its input is computed at claim, then approval(input)
 *   asked); pending -> awaiting_approval is an agent's gated call (its input known when planned)
 *   made due. awaiting_approval -> queued is an approval (the tool then runs as any stage);
 *   -> failed a rejection or the approval's timeout (approval_rejected / approval_timeout: an
 *   agent hears it as the tool's answer, a static run fails); -> cancelled its run ended.
 * run: queued -> running -> succeeded | failed | cancelled; expired when its deadline passes;
 *   failed -> running is the explicit retry.
 */
export const STAGE_TRANSITIONS = {
  pending: ['queued', 'running', 'failed', 'cancelled', 'awaiting_approval'],
  queued: ['running', 'failed', 'cancelled', 'waiting'],
  running: ['running', 'queued', 'succeeded', 'failed', 'cancelled', 'skipped', 'waiting', 'awaiting_approval'],
  waiting: ['queued', 'cancelled', 'succeeded'],
  awaiting_approval: ['queued', 'failed', 'cancelled'],
  succeeded: [],
  skipped: [],
  failed: ['queued', 'waiting'],
  cancelled: ['pending', 'queued', 'waiting'],
} as const satisfies Record<string, readonly string[]>;

export const RUN_TRANSITIONS = {
  queued: ['running', 'succeeded', 'failed', 'cancelled', 'expired'],
  running: ['succeeded', 'failed', 'cancelled', 'expired'],
  failed: ['running'],
  succeeded: [],
  cancelled: [],
  expired: [],
} as const satisfies Record<string, readonly string[]>;

export type StageState = keyof typeof STAGE_TRANSITIONS;
export type RunState = keyof typeof RUN_TRANSITIONS;
export const STAGE_STATES = Object.keys(STAGE_TRANSITIONS) as StageState[];
export const RUN_STATES = Object.keys(RUN_TRANSITIONS) as RunState[];
/** Terminal for watchers: `failed` may still be retried explicitly, but nothing moves it on its own. */
export const TERMINAL_RUN_STATES: RunState[] = ['succeeded', 'failed', 'cancelled', 'expired'];
/** The events that end a run (its stream ends with one, unless the run was retried after it). */
export const TERMINAL_EVENT_TYPES: readonly string[] = ['run_succeeded', 'run_failed', 'run_cancelled', 'run_expired'];
export const TERMINAL_STAGE_STATES: StageState[] = ['succeeded', 'failed', 'cancelled', 'skipped'];
/** States of a stage that waits holding no lease and costing no worker (issue 10; child runs and map items too). */
export const WAIT_STAGE_STATES: StageState[] = ['waiting', 'awaiting_approval'];

type Table = Record<string, readonly string[]>;
const tables = { stage: STAGE_TRANSITIONS as Table, run: RUN_TRANSITIONS as Table };

export function canTransition(entity: 'run' | 'stage', from: string, to: string): boolean {
  return tables[entity][from]?.includes(to) ?? false;
}

/** Throws IllegalTransitionError unless `from -> to` is in the table. */
export function assertTransition(entity: 'run' | 'stage', from: string, to: string, id?: string): void {
  if (!canTransition(entity, from, to)) throw new IllegalTransitionError(entity, from, to, id);
}

/** The states from which `to` may be entered: used to build the WHERE of every writer. */
export function sourcesOf(entity: 'stage', to: StageState): StageState[];
export function sourcesOf(entity: 'run', to: RunState): RunState[];
export function sourcesOf(entity: 'run' | 'stage', to: string): string[] {
  return Object.entries(tables[entity])
    .filter(([, next]) => next.includes(to))
    .map(([from]) => from);
}

/** A SQL list literal of states, e.g. `'queued','running'`; states are our own constants, never input. */
export function sqlStates(states: readonly string[]): string {
  return states.map((s) => `'${s}'`).join(',');
}
