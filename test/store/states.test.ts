import { describe, expect, it } from 'vitest';
import { IllegalTransitionError } from '../../src/errors.js';
import {
  assertTransition,
  canTransition,
  RUN_TRANSITIONS,
  sourcesOf,
  STAGE_TRANSITIONS,
  TERMINAL_STAGE_STATES,
} from '../../src/planner/states.js';

describe('the state table', () => {
  it('allows the protocol transitions and nothing out of a finished stage but an explicit retry', () => {
    expect(canTransition('stage', 'queued', 'running')).toBe(true);
    expect(canTransition('stage', 'running', 'running')).toBe(true); // reclaim
    // failed -> queued and cancelled -> pending are the explicit retry of a failed run (its failed stage, the later ones it cancelled);
    // -> waiting the same retry re-attaching a child-run stage to its child run, retried with it.
    const retried = ['queued', 'pending', 'waiting'];
    for (const s of TERMINAL_STAGE_STATES) expect(STAGE_TRANSITIONS[s].filter((t) => !retried.includes(t))).toEqual([]);
    expect(canTransition('stage', 'failed', 'waiting')).toBe(true);
    expect(STAGE_TRANSITIONS.succeeded).toEqual([]);
    expect(canTransition('stage', 'cancelled', 'pending')).toBe(true);
    expect(canTransition('stage', 'cancelled', 'queued')).toBe(true); // a run retry revives a parallel branch the failure cancelled while it was due
    expect(canTransition('stage', 'succeeded', 'queued')).toBe(false);
    expect(canTransition('stage', 'pending', 'succeeded')).toBe(false);
    expect(canTransition('stage', 'pending', 'running')).toBe(true); // the fast path
    expect(canTransition('run', 'succeeded', 'running')).toBe(false);
    expect(RUN_TRANSITIONS.cancelled).toEqual([]);
  });
  it('the run graph: skipped is terminal; waiting holds no lease and only goes back to queued or is cancelled', () => {
    expect(canTransition('stage', 'running', 'skipped')).toBe(true);
    expect(canTransition('stage', 'pending', 'skipped')).toBe(false); // a skip is decided at a claim
    expect(STAGE_TRANSITIONS.skipped).toEqual([]);
    expect(TERMINAL_STAGE_STATES).toContain('skipped');
    expect(canTransition('stage', 'running', 'waiting')).toBe(true);
    expect([...STAGE_TRANSITIONS.waiting].sort()).toEqual(['cancelled', 'queued', 'succeeded']); // succeeded: a signal delivered
    expect(canTransition('stage', 'waiting', 'running')).toBe(false); // never claimed while it waits
  });
  it('throws a typed error for an illegal transition', () => {
    expect(() => assertTransition('stage', 'succeeded', 'running', '7')).toThrow(IllegalTransitionError);
    try {
      assertTransition('run', 'expired', 'running');
    } catch (e) {
      expect(e).toMatchObject({ code: 'illegal_transition', entity: 'run', from: 'expired', to: 'running' });
    }
    expect(() => assertTransition('stage', 'nonsense', 'running')).toThrow(IllegalTransitionError);
  });
  it('derives the sources of a state from the table', () => {
    expect(sourcesOf('stage', 'running').sort()).toEqual(['pending', 'queued', 'running']);
    expect(sourcesOf('stage', 'cancelled').sort()).toEqual(['awaiting_approval', 'pending', 'queued', 'running', 'waiting']);
    expect(sourcesOf('run', 'running').sort()).toEqual(['failed', 'queued']);
  });
});
