import { z } from 'zod';
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
