import type { RunJson } from '../../api/schemas.js';
import type { EventJson } from '../../client/watch.js';
import { TERMINAL_EVENTS } from '../../client/watch.js';
import { depNames, depsText, errorText } from '../api/format.js';

/** What an event says about its stage's state, for the `stage` lines of `run --wait` (null: nothing visible changed). */
export function stageStateOf(e: EventJson): string | null {
  const data = e.data as { nextState?: unknown; kind?: unknown; outcome?: unknown } | null;
  switch (e.type) {
    case 'job_claimed':
    case 'lease_reclaimed':
      return 'running';
    case 'stage_succeeded':
      return 'succeeded';
    case 'stage_failed':
    case 'attempts_exhausted':
      return 'failed';
    case 'stage_duration_exceeded': // queued again or failed, as its retry policy said
      return typeof data?.nextState === 'string' ? data.nextState : null;
    case 'retry_scheduled':
    case 'lease_released':
    case 'approval_granted':
      return 'queued';
    case 'stage_cancelled':
      return 'cancelled';
    case 'stage_skipped':
      return 'skipped';
    // waits (issue 10): a sleep or a signal, a child run or a map's items, a person's approval
    case 'wait_started':
    case 'stage_waiting':
      return 'waiting';
    case 'approval_requested':
      return 'awaiting_approval';
    case 'wait_ended':
      // a sleep woken, a signal's timeout: queued for the claim that goes on (the other ends come with their own event)
      return data?.kind !== 'approval' && (data?.outcome === 'woken' || data?.outcome === 'timed_out') ? 'queued' : null;
    default:
      return null;
  }
}

export interface FollowOutput {
  /** JSON (one object per line) or text. */
  json: boolean;
  write(line: string): void;
}

/**
 * Prints a watched run as it goes: with `stages`, one `stage` line per stage change (seq, tool,
 * state, attempt, fence), else one line per event. Stage names come from the run, read again
 * when an event names a stage planned after the last read (an agent's tool calls).
 */
export function createFollower(out: FollowOutput, getRun: () => Promise<RunJson>, mode: 'stages' | 'events') {
  const stages = new Map<string, RunJson['stages'][number]>();
  const all = () => [...stages.values()];
  const emit = (obj: Record<string, unknown>, text: string) => out.write(out.json ? `${JSON.stringify(obj)}\n` : `${text}\n`);
  return {
    async event(e: EventJson): Promise<void> {
      if (mode === 'events') {
        emit(
          e as unknown as Record<string, unknown>,
          `${e.at}  ${e.type.padEnd(22)} ${e.stageId ? `stage ${e.stageId}` : '        '}` +
            `${e.attempt !== null ? `  attempt ${e.attempt}` : ''}${e.fence ? `  fence ${e.fence}` : ''}`,
        );
        return;
      }
      const state = stageStateOf(e);
      if (!state || !e.stageId) return;
      if (!stages.has(e.stageId)) for (const s of (await getRun()).stages) stages.set(s.id, s);
      const s = stages.get(e.stageId);
      if (!s) return;
      const err =
        (e.data as { error?: unknown; lastError?: unknown } | null)?.error ?? (e.data as { lastError?: unknown } | null)?.lastError;
      emit(
        {
          type: 'stage',
          runId: e.runId,
          seq: s.seq,
          name: s.name,
          tool: s.tool,
          state,
          attempt: e.attempt ?? s.attempt,
          fence: e.fence,
          deps: depNames(s.deps, all()),
          ...(err ? { lastError: err } : {}),
        },
        `  stage ${s.seq} ${s.tool.padEnd(18)} ${state.padEnd(9)} attempt ${e.attempt ?? s.attempt}  fence ${e.fence ?? '-'}` +
          `  deps ${depsText(depNames(s.deps, all()))}` +
          (err && state !== 'succeeded' ? `  (${errorText(err)})` : ''),
      );
    },
    isTerminal: (e: EventJson) => TERMINAL_EVENTS.includes(e.type),
  };
}
