import { z } from 'zod';
import { InvalidDefinitionError, PermanentError } from '../errors.js';
import { CONTROL_CLASS } from './builtin.js';
import { brandTool, isWorkflow, zodSchemaField } from './guards.js';
import { TOOL_NAME } from './tool.js';
import type { ChildWorkflowSpec, Tool, Workflow } from './types.js';
import { definitionPath, parseDefinition } from './validate.js';
import { workflowVersionSchema } from './workflow.js';

export const workflowToolOptionsSchema = z.strictObject({
  workflow: z.union([
    z.string().regex(TOOL_NAME, 'must be a workflow name'),
    z.custom<Workflow>(isWorkflow, { message: 'not a workflow' }),
  ]),
  version: workflowVersionSchema.optional(),
  name: z.string().regex(TOOL_NAME, 'must be a letter then up to 63 letters, digits, "_" or "-"').optional(),
  description: z.string().min(1).max(10_000),
  input: zodSchemaField.optional(),
});

export interface WorkflowToolOptions {
  /** The workflow (or agent) the tool starts as a child run: by name (then give `input`), or the definition itself. */
  workflow: string | Workflow<any>;
  /** A version to start (by name only); default the newest loaded. */
  version?: number;
  /** The tool's name as the model sees it (default: the workflow's name). */
  name?: string;
  /** What the model is told the tool does. */
  description: string;
  /** The arguments the model must give: the child run's input (default: the workflow's own input schema). */
  input?: z.ZodType;
}

/**
 * Another workflow or agent offered to an agent as a tool: a call starts a child run (keyed by
 * the calling stage, so a retry or a crash never starts a second one), waited for without a
 * lease, and the child's result is the tool's answer (its failure, a tool error). So sub-agents
 * are durable too. Its stage runs in the built-in `$control` class.
 */
export function defineWorkflowTool(options: WorkflowToolOptions): Tool {
  const w = (options as { workflow?: unknown } | null)?.workflow;
  const where = definitionPath(
    'workflowTool',
    (options as { name?: unknown } | null)?.name ?? (typeof w === 'string' ? w : (w as Workflow | undefined)?.name),
  );
  const o = parseDefinition(workflowToolOptionsSchema, options, where);
  const byName = typeof o.workflow === 'string';
  if (!byName && o.version !== undefined) {
    throw new InvalidDefinitionError('version goes with a workflow named by a string; a definition carries its own', `${where}.version`);
  }
  const input = options.input ?? (byName ? undefined : (o.workflow as Workflow).input);
  if (!input)
    throw new InvalidDefinitionError('a workflow named by a string needs `input`: the arguments the model must give', `${where}.input`);
  const childWorkflow: ChildWorkflowSpec = Object.freeze(
    typeof o.workflow === 'string'
      ? { name: o.workflow, version: o.version ?? null }
      : { name: o.workflow.name, version: o.workflow.version },
  );
  const tool: Tool = {
    kind: 'tool',
    name: o.name ?? childWorkflow.name,
    description: o.description,
    class: CONTROL_CLASS,
    input: input as z.ZodType<unknown>,
    output: z.unknown(),
    retry: CONTROL_CLASS.retry,
    childWorkflow,
    run: async () => {
      throw new PermanentError('a workflow tool starts a child run through the planner; it is never run as a tool', { code: 'not_a_tool' });
    },
  };
  return Object.freeze(brandTool(tool));
}
