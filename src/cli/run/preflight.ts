import { loadWorkflows } from '../../definitions/loader.js';
import { createRegistry } from '../../definitions/registry.js';
import type { Workflow } from '../../definitions/types.js';
import { InvalidInputError } from '../../errors.js';

/**
 * Everything `ratchet run` can refuse before it opens a database: the workflows load, the name
 * is known, the input passes the workflow's schema. A refusal is an InvalidInputError (exit 2)
 * and nothing is written — not even an embedded data directory.
 */
export async function preflight(
  workflowsDir: string,
  name: string,
  input: unknown,
): Promise<{ workflows: Workflow[]; workflow: Workflow }> {
  const workflows = await loadWorkflows(workflowsDir);
  const workflow = createRegistry(workflows).require(name);
  const parsed = workflow.input.safeParse(input);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    throw new InvalidInputError(
      `the input does not fit workflow "${name}": ${issue.message}`,
      ['input', ...issue.path.map(String)].join('.'),
      {
        reason: 'input_rejected',
        issues: parsed.error.issues.map((i) => ({ path: i.path.map(String), message: i.message })),
      },
    );
  }
  return { workflows, workflow };
}
