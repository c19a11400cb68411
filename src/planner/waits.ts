import { createHash } from 'node:crypto';
import type { z } from 'zod';
import { canonicalJson } from '../definitions/fingerprint.js';
import { agentSleepInputSchema } from '../definitions/waits.js';
import type { AgentSpec, Step, StepInputArgs, Tool, Workflow } from '../definitions/types.js';
import { AGENT_SLEEP_TOOL } from '../definitions/builtin.js';

/** What the approval decisions read of a tool (any tool: its input type does not matter here). */
// biome-ignore lint/suspicious/noExplicitAny: a Tool<{ id: string }> is no Tool<unknown> (its functions take I)
export type GatedTool = Pick<Tool<any, any>, 'name' | 'approval' | 'input'>;
import type { WaitErrorCode } from '../errors.js';
import { isStorableText } from '../store/json.js';

/**
 * Waits (issue 10), pure: when a sleep is due, how a signal wait starts and times out, whether a
 * gated tool call needs a person, what an approval's edited input becomes, and what a rejection
 * does (an agent hears it as the tool's answer; a static run fails). Times are the database
 * clock's `now`, passed in: nothing here reads a clock. The store and the claim apply these
 * decisions (WAITS-NOTES.md).
 */

/** What a waiting stage waits for (ratchet.waits.kind). */
export const WAIT_KINDS = ['sleep', 'signal', 'approval'] as const;
export type WaitKind = (typeof WAIT_KINDS)[number];

/** A wait's error: permanent (never retried), stored as the stage's `error`. */
export interface WaitError {
  code: WaitErrorCode;
  message: string;
  kind: 'permanent';
  details?: Record<string, unknown>;
}

const waitError = (code: WaitErrorCode, message: string, details?: Record<string, unknown>): WaitError => ({
  code,
  message,
  kind: 'permanent',
  ...(details ? { details } : {}),
});

/**
 * What the claim of a wait step decides:
 * - `wait`: the stage waits (state `waiting`, no lease) until `until` (a sleep's end, a signal's timeout);
 * - `succeed`: it ends at once with `output` (a sleep already due; a signal already kept; a timeout's onTimeout value);
 * - `fail`: it fails for good with `error`.
 */
export type WaitDecision =
  | { kind: 'wait'; wait: WaitKind; until: Date }
  | { kind: 'succeed'; output: unknown; signalId?: string }
  | { kind: 'fail'; error: WaitError };

const isValidDate = (d: unknown): d is Date => d instanceof Date && !Number.isNaN(d.getTime());

/** A JSON value as stored (undefined members dropped), or the reason it is none. */
function asJson(value: unknown): { ok: true; value: unknown } | { ok: false; problem: string } {
  if (value === undefined) return { ok: false, problem: 'returned undefined' };
  try {
    const text = JSON.stringify(value);
    if (text === undefined || !isStorableText(text)) return { ok: false, problem: 'returned what cannot be stored as JSON' };
    return { ok: true, value: JSON.parse(text) as unknown };
  } catch (err) {
    return { ok: false, problem: `returned what is not JSON (${(err as Error).message})` };
  }
}

/** The output of a sleep that ended: when it was due (ISO). */
export const sleptOutput = (until: Date): { sleptUntil: string } => ({ sleptUntil: until.toISOString() });

/**
 * A sleep step's claim: the time it is due, by the database clock — `now + sleep`, or its
 * `until()` (a time already past is due at once: the stage succeeds without waiting). until()
 * throwing or not returning a valid Date fails the stage with `sleep_until_failed`.
 */
export function startSleep(step: Step, args: StepInputArgs, now: Date): WaitDecision {
  const spec = step.sleep;
  if (!spec) throw new Error(`step ${step.name} is not a sleep step`);
  let until: Date;
  if (spec.ms !== null) {
    until = new Date(now.getTime() + spec.ms);
  } else {
    let value: unknown;
    try {
      value = spec.until!(args);
    } catch (err) {
      return { kind: 'fail', error: waitError('sleep_until_failed', `until() threw: ${err instanceof Error ? err.message : String(err)}`) };
    }
    if (!isValidDate(value)) {
      return { kind: 'fail', error: waitError('sleep_until_failed', 'until() must return a valid Date', { got: describe(value) }) };
    }
    until = value;
  }
  return until.getTime() <= now.getTime() ? { kind: 'succeed', output: sleptOutput(until) } : { kind: 'wait', wait: 'sleep', until };
}

/**
 * The claim of a stage whose wait's time came (the sweeper queued it again): a sleep succeeds
 * with `{ sleptUntil }`; a signal wait times out (signalTimedOut). A claim before the time (a
 * stale wake-up) waits again until it.
 */
export function wakeSleep(until: Date, now: Date): WaitDecision {
  return until.getTime() <= now.getTime() ? { kind: 'succeed', output: sleptOutput(until) } : { kind: 'wait', wait: 'sleep', until };
}

/**
 * The agent's built-in sleep tool: the model's input (seconds or until) as a wait. A sleep
 * longer than the agent allows, or an input that does not parse, is told to the model as the
 * tool's answer (`refuse`), never a run failure: the model can ask again.
 */
export function startAgentSleep(
  input: unknown,
  now: Date,
  maxMs: number,
): { kind: 'wait'; until: Date } | { kind: 'succeed'; output: unknown } | { kind: 'refuse'; answer: Record<string, unknown> } {
  const parsed = agentSleepInputSchema.safeParse(input);
  if (!parsed.success)
    return { kind: 'refuse', answer: { error: 'invalid_sleep', message: parsed.error.issues[0]?.message ?? 'bad input' } };
  const until = parsed.data.seconds !== undefined ? new Date(now.getTime() + parsed.data.seconds * 1000) : new Date(parsed.data.until!);
  if (until.getTime() - now.getTime() > maxMs) {
    return {
      kind: 'refuse',
      answer: {
        error: 'sleep_too_long',
        message: `this agent may sleep at most ${Math.floor(maxMs / 1000)} seconds at a time`,
        maxSeconds: Math.floor(maxMs / 1000),
      },
    };
  }
  return until.getTime() <= now.getTime() ? { kind: 'succeed', output: sleptOutput(until) } : { kind: 'wait', until };
}

/** The payload of a signal checked by its step's schema: the parsed value, or the first problem with its path. */
export function checkSignalPayload(
  schema: z.ZodType,
  payload: unknown,
): { ok: true; value: unknown } | { ok: false; path: string; message: string; issues: { path: string[]; message: string }[] } {
  const r = schema.safeParse(payload);
  if (r.success) {
    const json = asJson(r.data);
    if (!json.ok) return { ok: false, path: 'payload', message: `the parsed payload ${json.problem}`, issues: [] };
    return { ok: true, value: json.value };
  }
  const issue = r.error.issues[0]!;
  return {
    ok: false,
    path: ['payload', ...issue.path.map(String)].join('.'),
    message: issue.message,
    issues: r.error.issues.map((i) => ({ path: i.path.map(String), message: i.message })),
  };
}

/** A signal kept for the run before its wait started (the oldest unconsumed one of that name). */
export interface KeptSignal {
  signalId: string;
  payload: unknown;
}

/**
 * A signal step's claim: a signal kept before the wait is consumed at once (the stage succeeds
 * with its payload, checked again by the schema: the run's definition is the one it was checked
 * by, so this only guards a hand-edited row); else the stage waits until `now + timeout`.
 */
export function startSignalWait(step: Step, now: Date, kept: KeptSignal | null): WaitDecision {
  const spec = step.signal;
  if (!spec) throw new Error(`step ${step.name} is not a signal step`);
  if (kept) {
    const checked = checkSignalPayload(spec.schema, kept.payload);
    if (checked.ok) return { kind: 'succeed', output: checked.value, signalId: kept.signalId };
  }
  return { kind: 'wait', wait: 'signal', until: new Date(now.getTime() + spec.timeoutMs) };
}

/**
 * A signal wait whose timeout passed (by the database clock) with no signal: `onTimeout`'s value
 * as the output when the step has one (it throwing, or returning what is not JSON, fails with
 * `on_timeout_failed`), else `signal_timeout`. A claim before the timeout waits again.
 */
export function signalTimedOut(step: Step, args: StepInputArgs, since: Date, until: Date, now: Date): WaitDecision {
  const spec = step.signal;
  if (!spec) throw new Error(`step ${step.name} is not a signal step`);
  if (until.getTime() > now.getTime()) return { kind: 'wait', wait: 'signal', until };
  const evidence = { signal: spec.name, since: since.toISOString(), timeoutMs: spec.timeoutMs, timedOutAt: until.toISOString() };
  if (!spec.onTimeout) {
    return {
      kind: 'fail',
      error: waitError('signal_timeout', `no signal "${spec.name}" within ${spec.timeoutMs} ms of ${since.toISOString()}`, evidence),
    };
  }
  let value: unknown;
  try {
    value = spec.onTimeout(args);
  } catch (err) {
    return {
      kind: 'fail',
      error: waitError('on_timeout_failed', `onTimeout() threw: ${err instanceof Error ? err.message : String(err)}`, evidence),
    };
  }
  const json = asJson(value);
  if (!json.ok) return { kind: 'fail', error: waitError('on_timeout_failed', `onTimeout() ${json.problem}`, evidence) };
  return { kind: 'succeed', output: json.value };
}

/**
 * Does this call of a tool wait for a person? `approval: true`: always; a function: its answer
 * for the call's input. A function that throws, or answers anything but a boolean, counts as
 * "ask a person" (`error` says why): a gate whose own check is broken must not wave an
 * irreversible call through.
 */
export function approvalNeeded(tool: GatedTool, input: unknown): { needed: boolean; error?: string } {
  const gate = tool.approval;
  if (!gate) return { needed: false };
  if (gate.when === true) return { needed: true };
  try {
    const answer = gate.when(input);
    if (typeof answer === 'boolean') return { needed: answer };
    return { needed: true, error: `approval() returned ${describe(answer)}, not a boolean: a person decides` };
  } catch (err) {
    return { needed: true, error: `approval() threw (${err instanceof Error ? err.message : String(err)}): a person decides` };
  }
}

/** When an approval times out (the tool's approvalTimeout from the moment it started waiting), or null: it waits. */
export function approvalDeadline(tool: GatedTool, since: Date): Date | null {
  const ms = tool.approval?.timeoutMs ?? null;
  return ms === null ? null : new Date(since.getTime() + ms);
}

/** sha256 (hex) of a JSON value's canonical text: what the events say about an edited input (never the input). */
export function inputHash(value: unknown): string {
  return createHash('sha256').update(canonicalJson(value)).digest('hex');
}

/**
 * The input an approval lets the tool run with: the stage's own, or the approver's edit checked
 * by the tool's zod input schema (refused with the path of the first problem: a 422, nothing
 * changed) and stored as sent, not as parsed. The hash of an edited input goes into the events.
 */
export function approvedInput(
  tool: GatedTool,
  edited: unknown,
):
  | { ok: true; edited: false }
  | { ok: true; edited: true; input: unknown; inputHash: string }
  | { ok: false; path: string; message: string; issues: { path: string[]; message: string }[] } {
  if (edited === undefined) return { ok: true, edited: false };
  const r = tool.input.safeParse(edited);
  if (!r.success) {
    const issue = r.error.issues[0]!;
    return {
      ok: false,
      path: ['input', ...issue.path.map(String)].join('.'),
      message: issue.message,
      issues: r.error.issues.map((i) => ({ path: i.path.map(String), message: i.message })),
    };
  }
  // What the person sent, validated but raw: the tool's schema parses the stored input again when it runs,
  // so storing zod's output would apply its transforms and defaults twice.
  const json = asJson(edited);
  if (!json.ok) return { ok: false, path: 'input', message: `the edited input ${json.problem}`, issues: [] };
  return { ok: true, edited: true, input: json.value, inputHash: inputHash(json.value) };
}

/** A decision that refuses a gated call: a person's rejection, or the approval's timeout. */
export interface Refusal {
  outcome: 'rejected' | 'timed_out';
  /** Who decided (the token's identity; null for a timeout). */
  decidedBy: string | null;
  decidedAt: Date;
  /** The rejection's reason (null for a timeout, or a rejection without one). */
  reason: string | null;
}

/** The stage error of a refused call (code approval_rejected / approval_timeout, the decision in details). */
export function refusalError(tool: string, r: Refusal, timeoutMs: number | null = null): WaitError {
  const details = {
    tool,
    decidedBy: r.decidedBy,
    decidedAt: r.decidedAt.toISOString(),
    reason: r.reason,
    ...(r.outcome === 'timed_out' ? { timeoutMs } : {}),
  };
  return r.outcome === 'rejected'
    ? waitError(
        'approval_rejected',
        `the call of ${tool} was rejected${r.decidedBy ? ` by ${r.decidedBy}` : ''}${r.reason ? `: ${r.reason}` : ''}`,
        details,
      )
    : waitError(
        'approval_timeout',
        `no one approved the call of ${tool} in time${timeoutMs !== null ? ` (${timeoutMs} ms)` : ''}`,
        details,
      );
}

/**
 * What an agent's model hears as the answer of a refused call: not a tool failure
 * (`tool_failed`) but a person's decision, with the reason, so it can go on another way.
 */
export function refusalAnswer(error: { code?: unknown; details?: unknown }): Record<string, unknown> | null {
  if (error.code !== 'approval_rejected' && error.code !== 'approval_timeout') return null;
  const d = (error.details ?? {}) as Record<string, unknown>;
  return error.code === 'approval_rejected'
    ? {
        error: 'approval_rejected',
        message: 'a person rejected this call; the tool did not run',
        reason: d.reason ?? null,
        decidedBy: d.decidedBy ?? null,
      }
    : { error: 'approval_timeout', message: 'no one approved this call in time; the tool did not run' };
}

/**
 * What a refused call does to its run: an agent's call ends `failed` but counts as done (its
 * refusal is the tool's answer; the next model call goes on, whatever onToolError says: a
 * person's decision is no tool error, and it does not count against maxToolErrors); a static
 * step fails the run with approval_rejected / approval_timeout (continueOnError keeps it as a
 * value, like any failure).
 */
export function decideRefusal(
  workflow: Workflow,
  step: Step | null,
  tool: GatedTool,
  r: Refusal,
): { kind: 'tell_model'; error: WaitError; answer: Record<string, unknown> } | { kind: 'value' | 'fail_run'; error: WaitError } {
  const error = refusalError(tool.name, r, tool.approval?.timeoutMs ?? null);
  if (workflow.agent) return { kind: 'tell_model', error, answer: refusalAnswer(error)! };
  return step?.continueOnError ? { kind: 'value', error } : { kind: 'fail_run', error };
}

/** A stage's ratchet.waits row as the claim reads it (the last wait of the stage; a retried run's earlier one is replaced). */
export interface StageWait {
  kind: WaitKind;
  since: Date;
  until: Date | null;
  /** null while the wait is open; else woken | signalled | timed_out | approved | rejected | cancelled | expired. */
  outcome: string | null;
}

/** How a wait starts (src/store/signals.ts beginWait): until an absolute time, `inMs` from the wait's start by the database clock, or no limit. */
export type WaitUntil = { at: Date } | { inMs: number } | null;

/**
 * What the claim of a waiting kind of stage decides (the wait branches of src/planner/decide.ts):
 * begin a wait (the stage hands back its lease; `input` is stored on the stage for a person to
 * read and edit), run the tool (an approved call), end with a value, or fail for good.
 */
export type WaitClaim =
  | { kind: 'begin_wait'; wait: WaitKind; until: WaitUntil; signalName?: string; input?: unknown }
  | { kind: 'run'; input: unknown }
  | { kind: 'done'; result: unknown }
  | { kind: 'fail'; error: WaitError };

const fromDecision = (d: WaitDecision): WaitClaim =>
  d.kind === 'succeed'
    ? { kind: 'done', result: d.output }
    : d.kind === 'fail'
      ? { kind: 'fail', error: d.error }
      : { kind: 'begin_wait', wait: d.wait, until: { at: d.until } };

/** A sleep step's claim: its first one starts the sleep; the one after the sweeper woke it ends it with `{ sleptUntil }`. */
export function decideSleepStep(step: Step, args: StepInputArgs, now: Date, wait: StageWait | null): WaitClaim {
  if (wait?.kind === 'sleep' && wait.outcome === 'woken' && wait.until) return fromDecision(wakeSleep(wait.until, now));
  return fromDecision(startSleep(step, args, now));
}

/** Errors a signal step ends with when its timeout passed: a run retried from one waits again (a new wait). */
const SIGNAL_TIMEOUT_CODES = new Set(['signal_timeout', 'on_timeout_failed']);

/**
 * Is the ended signal wait `outcome` of a stage with error `stageError` the one its next claim ends
 * (the sweeper's timeout: onTimeout or signal_timeout), rather than an old wait its next claim
 * replaces by a new one (a run retried from signal_timeout, a cancelled wait revived by a retry)?
 */
export function signalTimeoutPending(outcome: string | null, stageError: unknown): boolean {
  const code = (stageError as { code?: unknown } | null)?.code;
  return outcome === 'timed_out' && !SIGNAL_TIMEOUT_CODES.has(code as string);
}

/**
 * A signal step's claim: after the sweeper found its timeout passed, onTimeout or
 * signal_timeout (signalTimedOut); else (its first claim, or a run retried after the timeout
 * failed it) a new wait of `timeout` from now, which takes a signal kept for it at once.
 */
export function decideSignalStep(step: Step, args: StepInputArgs, now: Date, wait: StageWait | null, stageError: unknown): WaitClaim {
  const spec = step.signal;
  if (!spec) throw new Error(`step ${step.name} is not a signal step`);
  if (wait?.kind === 'signal' && wait.until && signalTimeoutPending(wait.outcome, stageError)) {
    return fromDecision(signalTimedOut(step, args, wait.since, wait.until, now));
  }
  return { kind: 'begin_wait', wait: 'signal', signalName: spec.name, until: { inMs: spec.timeoutMs } };
}

/**
 * A gated tool call's claim (static step or agent call): approved → run with the stage's stored
 * input (the approver's edit, if any), never asking again; else (first claim, or a run retried
 * after a rejection or a timeout) approval(input) decides: ask a person (the call's input stored
 * on the stage for them to read and edit), or run.
 */
export function decideGate(tool: GatedTool, input: unknown, stored: unknown, wait: StageWait | null): WaitClaim {
  if (wait?.kind === 'approval' && wait.outcome === 'approved') return { kind: 'run', input: stored ?? input };
  if (!approvalNeeded(tool, input).needed) return { kind: 'run', input };
  const ms = tool.approval?.timeoutMs ?? null;
  return { kind: 'begin_wait', wait: 'approval', until: ms === null ? null : { inMs: ms }, input };
}

/** The agent's built-in sleep tool at claim: a refusal is the tool's answer (the model reads it); else as a sleep step. */
export function decideAgentSleep(input: unknown, now: Date, maxMs: number, wait: StageWait | null): WaitClaim {
  if (wait?.kind === 'sleep' && wait.outcome === 'woken' && wait.until) return fromDecision(wakeSleep(wait.until, now));
  const d = startAgentSleep(input, now, maxMs);
  if (d.kind === 'refuse') return { kind: 'done', result: d.answer };
  if (d.kind === 'succeed') return { kind: 'done', result: d.output };
  return { kind: 'begin_wait', wait: 'sleep', until: { at: d.until } };
}

/** The tools an agent's model is offered, and may call: its own, and the built-in sleep tool when it allows it. */
export function offeredTools(agent: AgentSpec): readonly Tool[] {
  return agent.sleep ? [...agent.tools, AGENT_SLEEP_TOOL] : agent.tools;
}

/** Is a wait's time limit passed by the database clock? (The sweeper's question, by row.) */
export const waitDue = (until: Date | null, now: Date): boolean => until !== null && until.getTime() <= now.getTime();

function describe(v: unknown): string {
  if (v === null) return 'null';
  if (v instanceof Date) return 'an invalid Date';
  return typeof v === 'string' ? JSON.stringify(v).slice(0, 50) : typeof v;
}
