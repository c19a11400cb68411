import { z } from 'zod';
import { resolveDuration } from './duration.js';
import { functionField, zodSchemaField } from './guards.js';

/**
 * Waits (issue 10) in definitions: sleep and signal steps, a tool's approval gate, an agent's
 * built-in sleep tool. A wait is timed by the database clock, never by a process's timer, so
 * its length is not bound by `setTimeout` (2^31-1 ms): it may last up to MAX_WAIT_MS.
 */

/** The longest sleep, signal timeout or approval timeout: 366 days. */
export const MAX_WAIT_MS = 366 * 24 * 60 * 60 * 1000;

/** The longest sleep an agent may ask for unless it says otherwise (`allowSleep: { max }`). */
export const DEFAULT_AGENT_SLEEP_MAX_MS = 7 * 24 * 60 * 60 * 1000;

/** A wait's length: an ms string ("10m", "7d") or milliseconds, more than 0, at most MAX_WAIT_MS. */
export const waitDurationSchema = z.unknown().transform((value, ctx): number => {
  const resolved = resolveDuration(value, MAX_WAIT_MS);
  if ('problem' in resolved) {
    ctx.issues.push({ code: 'custom', message: resolved.problem, input: value });
    return z.NEVER;
  }
  if (resolved.ms <= 0) {
    ctx.issues.push({ code: 'custom', message: 'must be greater than 0 ms', input: value });
    return z.NEVER;
  }
  return resolved.ms;
});

/** Signal names appear in URLs and CLI arguments: the tool-name rule. */
export const SIGNAL_NAME = /^[a-zA-Z][a-zA-Z0-9_-]{0,63}$/;
export const SIGNAL_NAME_RULE = 'must be a letter then up to 63 letters, digits, "_" or "-"';

/** `waitForSignal: { name, schema, timeout, onTimeout? }` */
export const waitForSignalSchema = z.strictObject({
  name: z.string().regex(SIGNAL_NAME, SIGNAL_NAME_RULE),
  schema: zodSchemaField,
  timeout: waitDurationSchema,
  onTimeout: functionField.optional(),
});

/** A tool's `approval` option: true, or a function of the call's input. */
export const approvalOptionSchema = z.union([z.literal(true), functionField], {
  message: 'must be true or a function (input) => boolean',
});

/** An agent's `allowSleep`: true (up to DEFAULT_AGENT_SLEEP_MAX_MS) or `{ max }`. */
export const allowSleepSchema = z.union([z.boolean(), z.strictObject({ max: waitDurationSchema })]);

/** The name of the built-in tool an agent that allows it may call to sleep (a valid model tool name). */
export const AGENT_SLEEP_TOOL_NAME = 'sleep';

/** What the model sends to the built-in sleep tool: seconds from now, or a time (exactly one). */
export const agentSleepInputSchema = z
  .strictObject({
    seconds: z.int().min(1).optional().describe('sleep this many seconds'),
    until: z.iso.datetime({ offset: true }).optional().describe('or sleep until this time (RFC 3339, with an offset)'),
    reason: z.string().max(500).optional().describe('why, for the people who read the run'),
  })
  .refine((v) => (v.seconds === undefined) !== (v.until === undefined), { message: 'give exactly one of seconds or until' });
