import { z } from 'zod';
import { InvalidDefinitionError } from '../errors.js';
import { brandTool, functionField, isToolClass, zodSchemaField } from './guards.js';
import { nonJsonParts } from './json-schema.js';
import { mergeRetryPolicy, retryOptionsSchema, type RetryOptions } from './retry-policy.js';
import type { ApprovalSpec, Duration, ReconcileResult, Tool, ToolClass, ToolContext } from './types.js';
import { definitionPath, parseDefinition } from './validate.js';
import { approvalOptionSchema, waitDurationSchema } from './waits.js';

/** OpenAI's rule for function names, so every tool can be offered to a model as is. */
export const TOOL_NAME = /^[a-zA-Z][a-zA-Z0-9_-]{0,63}$/;

export const toolOptionsSchema = z.strictObject({
  name: z.string().regex(TOOL_NAME, 'must be a letter then up to 63 letters, digits, "_" or "-"'),
  description: z.string().trim().min(1, 'must not be empty: the model reads it'),
  class: z.custom<ToolClass>(isToolClass, { message: 'unknown class: pass a tool class made by defineToolClass' }),
  input: zodSchemaField,
  output: zodSchemaField,
  run: functionField,
  reconcile: functionField.optional(),
  retry: retryOptionsSchema.optional(),
  idempotencyKey: functionField.optional(),
  approval: approvalOptionSchema.optional(),
  approvalTimeout: waitDurationSchema.optional(),
});

export interface ToolOptions<I, O> {
  name: string;
  description: string;
  class: ToolClass;
  input: z.ZodType<I>;
  output: z.ZodType<O>;
  run(input: I, ctx: ToolContext): Promise<O>;
  reconcile?: (input: I, ctx: ToolContext) => Promise<ReconcileResult<O>>;
  /** Merged over the class's policy, field by field. */
  retry?: RetryOptions;
  /** Ties the idempotency key to what the operation means, e.g. `invoice:42:create`. */
  idempotencyKey?: (input: I) => string;
  /**
   * An approval gate (issue 10): a call's stage waits in `awaiting_approval` for a person to
   * approve (optionally with an edited input, checked by `input`) or reject it before the tool
   * runs. true: every call; a function: the calls it answers true for.
   */
  approval?: true | ((input: I) => boolean);
  /** No decision within this long: the call is refused as `approval_timeout` (default: it waits). Needs `approval`. */
  approvalTimeout?: Duration;
}

/** A tool: a named, typed operation run by workers under its class's lease and policy. */
export function defineTool<I, O>(options: ToolOptions<I, O>): Tool<I, O> {
  const where = definitionPath('tool', (options as { name?: unknown } | null)?.name);
  const o = parseDefinition(toolOptionsSchema, options, where);
  // Results are stored as JSON and handed to later steps from there: refuse what JSON would change.
  const bad = nonJsonParts(o.output);
  if (bad.length > 0) {
    throw new InvalidDefinitionError(
      `output is not JSON-serialisable: ${bad.map((b) => `${b.type} at ${b.path}`).join(', ')} ` +
        '(results are stored as JSON; use strings or numbers, e.g. z.iso.datetime() for a date)',
      `${where}.output`,
      { parts: bad },
    );
  }
  if (o.approvalTimeout !== undefined && o.approval === undefined) {
    throw new InvalidDefinitionError('approvalTimeout needs approval (true or a function of the input)', `${where}.approvalTimeout`);
  }
  const approval: ApprovalSpec | undefined =
    o.approval === undefined
      ? undefined
      : Object.freeze({ when: o.approval as ApprovalSpec['when'], timeoutMs: o.approvalTimeout ?? null });
  const tool: Tool<I, O> = {
    kind: 'tool',
    name: o.name,
    description: o.description,
    class: o.class,
    input: options.input,
    output: options.output,
    run: options.run,
    retry: mergeRetryPolicy(o.class.retry, o.retry, `${where}.retry`),
    ...(options.reconcile ? { reconcile: options.reconcile } : {}),
    ...(options.idempotencyKey ? { idempotencyKey: options.idempotencyKey } : {}),
    ...(approval ? { approval } : {}),
  };
  return Object.freeze(brandTool(tool));
}
