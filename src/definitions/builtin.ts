import { z } from 'zod';
import { AGENT_SLEEP_TOOL_NAME, agentSleepInputSchema } from './waits.js';
import { PermanentError } from '../errors.js';
import { DEFAULT_RETRY_POLICY } from './retry-policy.js';
import { brandTool, brandToolClass } from './guards.js';
import type { Tool, ToolClass } from './types.js';

/**
 * Built-in stages the planner handles itself (no user code runs in them): the start and the end
 * of a child run. Their names are no valid user name ("$..."), so they never clash with one.
 */
export const CONTROL_CLASS_NAME = '$control';
export const CHILD_RUN_TOOL_NAME = '$workflow';

/**
 * The class of control stages: short work (computing an input, inserting a child run, reading
 * its result), so a short lease; retried like any stage.
 */
export const CONTROL_CLASS: ToolClass = Object.freeze(
  brandToolClass({
    kind: 'tool_class' as const,
    name: CONTROL_CLASS_NAME,
    leaseMs: 30_000,
    heartbeatMs: 10_000,
    timeoutMs: 20_000,
    maxDurationMs: 60_000,
    retry: DEFAULT_RETRY_POLICY,
    missedHeartbeats: 2,
    jitterMs: 1_000,
    isolation: 'none' as const,
    concurrency: null,
    rateLimit: null,
  }),
);

/**
 * The tool of a child-run step's stage. The planner starts the child run (keyed by the stage)
 * and ends the stage with the child's result; nothing ever calls run().
 */
export const CHILD_RUN_TOOL: Tool = Object.freeze(
  brandTool({
    kind: 'tool' as const,
    name: CHILD_RUN_TOOL_NAME,
    description: 'starts a child run of another workflow and takes its result',
    class: CONTROL_CLASS,
    input: z.unknown(),
    output: z.unknown(),
    retry: CONTROL_CLASS.retry,
    run: async () => {
      throw new PermanentError('a child-run step is handled by the planner, never run as a tool', { code: 'not_a_tool' });
    },
  }),
);

/** A wait's stage runs no user code: run() is never called (the planner ends the wait: src/planner/waits.ts). */
const notATool = (what: string) => async () => {
  throw new PermanentError(`${what} is handled by the planner, never run as a tool`, { code: 'not_a_tool' });
};

export const SLEEP_TOOL_NAME = '$sleep';
export const SIGNAL_TOOL_NAME = '$signal';

/** The tool of a sleep step's stage (issue 10): it waits without a lease until its time; its output is `{ sleptUntil }`. */
export const SLEEP_TOOL: Tool = Object.freeze(
  brandTool({
    kind: 'tool' as const,
    name: SLEEP_TOOL_NAME,
    description: 'waits until a time by the database clock, holding no lease',
    class: CONTROL_CLASS,
    input: z.unknown(),
    output: z.unknown(),
    retry: CONTROL_CLASS.retry,
    run: notATool('a sleep step'),
  }),
);

/** The tool of a waitForSignal step's stage (issue 10): it waits without a lease for the signal; its output is the payload. */
export const SIGNAL_TOOL: Tool = Object.freeze(
  brandTool({
    kind: 'tool' as const,
    name: SIGNAL_TOOL_NAME,
    description: 'waits for a signal sent to the run, holding no lease',
    class: CONTROL_CLASS,
    input: z.unknown(),
    output: z.unknown(),
    retry: CONTROL_CLASS.retry,
    run: notATool('a signal step'),
  }),
);

/**
 * The built-in `sleep` tool an agent may offer its model (`allowSleep`): the call's stage waits
 * without a lease, like a sleep step, and answers `{ sleptUntil }`.
 */
export const AGENT_SLEEP_TOOL: Tool = Object.freeze(
  brandTool({
    kind: 'tool' as const,
    name: AGENT_SLEEP_TOOL_NAME,
    description:
      'Pause this run without holding anything: give `seconds` from now or an `until` time. ' +
      'Use it to wait for something that takes time (a payment to clear, a time of day).',
    class: CONTROL_CLASS,
    input: agentSleepInputSchema as z.ZodType,
    output: z.object({ sleptUntil: z.string() }),
    retry: CONTROL_CLASS.retry,
    run: notATool('the agent sleep tool'),
  }),
);
