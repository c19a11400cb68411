import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineAgent } from '../../src/definitions/agent.js';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { toolAnswer } from '../../src/agent/messages.js';
import { failedToolCalls } from '../../src/planner/failure.js';
import {
  approvalDeadline,
  approvalNeeded,
  approvedInput,
  checkSignalPayload,
  decideRefusal,
  inputHash,
  refusalError,
  signalTimedOut,
  startAgentSleep,
  startSignalWait,
  startSleep,
  wakeSleep,
  waitDue,
} from '../../src/planner/waits.js';

const io = defineToolClass({ name: 'io', lease: '90s', heartbeat: '30s', timeout: '60s', maxDuration: '10m' });
const model = defineToolClass({ name: 'model', lease: '90s', heartbeat: '30s', timeout: '60s', maxDuration: '10m' });
const caseInput = z.object({ invoiceId: z.string(), amount: z.number().positive() });
const tool = (approval?: unknown, approvalTimeout?: string) =>
  defineTool({
    name: 'create_case',
    description: 'files a case',
    class: io,
    input: caseInput,
    output: z.object({ caseId: z.string() }),
    run: async () => ({ caseId: 'c' }),
    ...(approval !== undefined ? { approval: approval as true } : {}),
    ...(approvalTimeout ? { approvalTimeout } : {}),
  });
const now = new Date('2026-12-01T03:00:00.000Z');
const args = { input: { wakeAt: '2026-12-02T09:00:00.000Z' }, results: { fetch: { n: 1 } } };
const paid = z.object({ paid: z.boolean(), ref: z.string() });

const wf = defineWorkflow({
  name: 'waits',
  input: z.object({ wakeAt: z.string() }),
  steps: [
    { tool: tool(true), input: () => ({ invoiceId: 'i', amount: 1 }) },
    { sleep: '10m' },
    { name: 'tomorrow', until: ({ input }) => new Date(input.wakeAt) },
    { name: 'past', until: () => new Date('2020-01-01T00:00:00Z') },
    { name: 'broken', until: () => 'tomorrow' as unknown as Date },
    {
      name: 'throws',
      until: () => {
        throw new Error('no clock');
      },
    },
    { waitForSignal: { name: 'payment', schema: paid, timeout: '2d' } },
    {
      waitForSignal: { name: 'fallback', schema: paid, timeout: '1h', onTimeout: ({ results }) => ({ paid: false, from: results.fetch }) },
    },
    {
      waitForSignal: {
        name: 'bad_fallback',
        schema: paid,
        timeout: '1h',
        onTimeout: () => {
          throw new Error('nope');
        },
      },
    },
    { waitForSignal: { name: 'undef_fallback', schema: paid, timeout: '1h', onTimeout: () => undefined } },
  ],
});
const step = (name: string) => wf.steps.find((s) => s.name === name)!;

describe('sleep', () => {
  it('a duration is due at now + sleep by the database clock; until() at its time; a past time at once', () => {
    expect(startSleep(step('sleep'), args, now)).toEqual({ kind: 'wait', wait: 'sleep', until: new Date('2026-12-01T03:10:00.000Z') });
    expect(startSleep(step('tomorrow'), args, now)).toEqual({ kind: 'wait', wait: 'sleep', until: new Date('2026-12-02T09:00:00.000Z') });
    expect(startSleep(step('past'), args, now)).toEqual({ kind: 'succeed', output: { sleptUntil: '2020-01-01T00:00:00.000Z' } });
  });
  it('until() that throws or returns no valid Date fails the stage with sleep_until_failed', () => {
    expect(startSleep(step('broken'), args, now)).toMatchObject({ kind: 'fail', error: { code: 'sleep_until_failed', kind: 'permanent' } });
    expect(startSleep(step('throws'), args, now)).toMatchObject({
      kind: 'fail',
      error: { code: 'sleep_until_failed', message: /no clock/ },
    });
  });
  it('the wake-up claim: succeeds at or after its time; a stale early wake-up waits again', () => {
    const until = new Date('2026-12-01T03:10:00.000Z');
    expect(wakeSleep(until, until)).toEqual({ kind: 'succeed', output: { sleptUntil: until.toISOString() } });
    expect(wakeSleep(until, now)).toEqual({ kind: 'wait', wait: 'sleep', until });
    expect(waitDue(until, now)).toBe(false);
    expect(waitDue(until, until)).toBe(true);
    expect(waitDue(null, now)).toBe(false);
  });
  it("an agent's built-in sleep: seconds or until, within the agent's max; anything else is told to the model", () => {
    expect(startAgentSleep({ seconds: 60 }, now, 3_600_000)).toEqual({ kind: 'wait', until: new Date('2026-12-01T03:01:00.000Z') });
    expect(startAgentSleep({ until: '2026-12-01T03:30:00Z' }, now, 3_600_000)).toEqual({
      kind: 'wait',
      until: new Date('2026-12-01T03:30:00Z'),
    });
    expect(startAgentSleep({ until: '2026-11-01T00:00:00Z' }, now, 3_600_000)).toMatchObject({ kind: 'succeed' });
    expect(startAgentSleep({ seconds: 7200 }, now, 3_600_000)).toMatchObject({
      kind: 'refuse',
      answer: { error: 'sleep_too_long', maxSeconds: 3600 },
    });
    expect(startAgentSleep({ seconds: 1, until: '2026-12-01T03:30:00Z' }, now, 3_600_000)).toMatchObject({
      kind: 'refuse',
      answer: { error: 'invalid_sleep' },
    });
    expect(startAgentSleep({}, now, 3_600_000)).toMatchObject({ kind: 'refuse' });
  });
});

describe('signals', () => {
  it('a signal kept before the wait is consumed at once (payload = output); else the stage waits until now + timeout', () => {
    expect(startSignalWait(step('payment'), now, { signalId: 's1', payload: { paid: true, ref: 'r' } })).toEqual({
      kind: 'succeed',
      output: { paid: true, ref: 'r' },
      signalId: 's1',
    });
    expect(startSignalWait(step('payment'), now, null)).toEqual({
      kind: 'wait',
      wait: 'signal',
      until: new Date('2026-12-03T03:00:00.000Z'),
    });
    // A kept payload the schema refuses (a hand-edited row) is not consumed: the stage waits for a good one.
    expect(startSignalWait(step('payment'), now, { signalId: 's2', payload: { paid: 'yes' } })).toMatchObject({ kind: 'wait' });
  });
  it("the payload is checked by the step's schema, with the path of the first problem", () => {
    expect(checkSignalPayload(paid, { paid: true, ref: 'x' })).toEqual({ ok: true, value: { paid: true, ref: 'x' } });
    expect(checkSignalPayload(paid, { paid: true })).toMatchObject({ ok: false, path: 'payload.ref' });
    expect(checkSignalPayload(paid, null)).toMatchObject({ ok: false, path: 'payload' });
  });
  it('timeout: signal_timeout with since and timeout as evidence; onTimeout gives the output; onTimeout failing is on_timeout_failed', () => {
    const since = now;
    const until = new Date(now.getTime() + 3_600_000);
    const later = new Date(until.getTime() + 1);
    expect(signalTimedOut(step('payment'), args, since, new Date(now.getTime() + 172_800_000), later)).toMatchObject({ kind: 'wait' });
    const due = new Date(now.getTime() + 172_800_000);
    expect(signalTimedOut(step('payment'), args, since, due, due)).toEqual({
      kind: 'fail',
      error: {
        code: 'signal_timeout',
        kind: 'permanent',
        message: expect.stringMatching(/no signal "payment" within 172800000 ms/),
        details: { signal: 'payment', since: since.toISOString(), timeoutMs: 172_800_000, timedOutAt: due.toISOString() },
      },
    });
    expect(signalTimedOut(step('fallback'), args, since, until, later)).toEqual({
      kind: 'succeed',
      output: { paid: false, from: { n: 1 } },
    });
    expect(signalTimedOut(step('bad_fallback'), args, since, until, later)).toMatchObject({
      kind: 'fail',
      error: { code: 'on_timeout_failed', message: /nope/ },
    });
    expect(signalTimedOut(step('undef_fallback'), args, since, until, later)).toMatchObject({
      kind: 'fail',
      error: { code: 'on_timeout_failed' },
    });
  });
});

describe('approval gates', () => {
  it('true: every call; a function: by the input; a broken function: a person decides; no approval: none', () => {
    expect(approvalNeeded(tool(), { invoiceId: 'i', amount: 5 })).toEqual({ needed: false });
    expect(approvalNeeded(tool(true), { invoiceId: 'i', amount: 5 })).toEqual({ needed: true });
    const big = tool((i: { amount: number }) => i.amount > 100);
    expect(approvalNeeded(big, { invoiceId: 'i', amount: 5 })).toEqual({ needed: false });
    expect(approvalNeeded(big, { invoiceId: 'i', amount: 500 })).toEqual({ needed: true });
    expect(
      approvalNeeded(
        tool(() => {
          throw new Error('x');
        }),
        {},
      ),
    ).toMatchObject({ needed: true, error: /threw/ });
    expect(
      approvalNeeded(
        tool(() => 'yes'),
        {},
      ),
    ).toMatchObject({ needed: true, error: /not a boolean/ });
  });
  it('the timeout counts from the start of the wait; none without approvalTimeout', () => {
    expect(approvalDeadline(tool(true, '2h'), now)).toEqual(new Date('2026-12-01T05:00:00.000Z'));
    expect(approvalDeadline(tool(true), now)).toBeNull();
  });
  it("an edited input is checked by the tool's schema (path of the first problem); its hash is canonical", () => {
    expect(approvedInput(tool(true), undefined)).toEqual({ ok: true, edited: false });
    const ok = approvedInput(tool(true), { amount: 9, invoiceId: 'i-9' });
    expect(ok).toEqual({
      ok: true,
      edited: true,
      input: { amount: 9, invoiceId: 'i-9' },
      inputHash: inputHash({ invoiceId: 'i-9', amount: 9 }),
    });
    expect(approvedInput(tool(true), { invoiceId: 'i', amount: -1 })).toMatchObject({ ok: false, path: 'input.amount' });
    expect(approvedInput(tool(true), 'nope')).toMatchObject({ ok: false, path: 'input' });
  });
  it('an edited input is stored as the person sent it (validated, raw): the tool parses it when it runs, transforms and defaults apply once', () => {
    const cents = defineTool({
      name: 'pay',
      description: 'pays',
      class: io,
      input: z.object({ amount: z.number().transform((n) => n * 100), note: z.string().default('none') }),
      output: z.object({ ok: z.boolean() }),
      run: async () => ({ ok: true }),
      approval: true,
    });
    const r = approvedInput(cents, { amount: 3 });
    expect(r).toEqual({ ok: true, edited: true, input: { amount: 3 }, inputHash: inputHash({ amount: 3 }) });
    expect(approvedInput(cents, { amount: 'x' })).toMatchObject({ ok: false, path: 'input.amount' });
  });
  it("a rejection: an agent hears it as the tool's answer (not a tool error, not counted); a static run fails with approval_rejected", () => {
    const t = tool(true, '1h');
    const agent = defineAgent({
      name: 'a',
      input: z.object({}),
      model: { name: 'm', class: model },
      instructions: 'x',
      tools: [t],
      onToolError: 'fail',
    });
    const r = { outcome: 'rejected' as const, decidedBy: 'token:abc', decidedAt: now, reason: 'wrong amount' };
    const told = decideRefusal(agent, null, t, r);
    expect(told).toEqual({
      kind: 'tell_model',
      error: {
        code: 'approval_rejected',
        kind: 'permanent',
        message: 'the call of create_case was rejected by token:abc: wrong amount',
        details: { tool: 'create_case', decidedBy: 'token:abc', decidedAt: now.toISOString(), reason: 'wrong amount' },
      },
      answer: { error: 'approval_rejected', message: expect.any(String), reason: 'wrong amount', decidedBy: 'token:abc' },
    });
    // What the next model call reads for that stage, and the maxToolErrors count.
    const stage = { state: 'failed', result: null, error: told.error };
    expect(JSON.parse(toolAnswer(stage))).toEqual(told.kind === 'tell_model' ? told.answer : null);
    expect(
      failedToolCalls([
        { tool: 'create_case', state: 'failed', error: told.error },
        { tool: 'x', state: 'failed', error: { code: 'boom' } },
      ]),
    ).toBe(1);

    const staticRun = defineWorkflow({ name: 's', input: z.object({}), steps: [{ tool: t, input: () => ({}) }] });
    expect(decideRefusal(staticRun, staticRun.steps[0]!, t, r)).toMatchObject({ kind: 'fail_run', error: { code: 'approval_rejected' } });
    const tolerant = defineWorkflow({ name: 's2', input: z.object({}), steps: [{ tool: t, input: () => ({}), continueOnError: true }] });
    expect(decideRefusal(tolerant, tolerant.steps[0]!, t, r)).toMatchObject({ kind: 'value' });
    const timeout = refusalError('create_case', { outcome: 'timed_out', decidedBy: null, decidedAt: now, reason: null }, 3_600_000);
    expect(timeout).toMatchObject({ code: 'approval_timeout', details: { timeoutMs: 3_600_000, decidedBy: null } });
    expect(JSON.parse(toolAnswer({ state: 'failed', result: null, error: timeout }))).toMatchObject({ error: 'approval_timeout' });
  });
});
