import { InvalidDefinitionError, InvalidInputError } from '../errors.js';
import { isWorkflow } from './guards.js';
import type { Tool, ToolClass, Workflow } from './types.js';

export interface Registry {
  get(name: string): Workflow | undefined;
  /** The workflow, or an InvalidInputError (code `invalid_input`, `details.reason` `unknown_workflow`). */
  require(name: string): Workflow;
  list(): Workflow[];
  tool(name: string): Tool | undefined;
  toolClasses(): ToolClass[];
}

function origin(w: Workflow): string {
  return w.sourceFile ? `workflow "${w.name}" (${w.sourceFile})` : `workflow "${w.name}"`;
}

/** Workflows, tools and classes by name; one name means one definition across all workflows. */
export function createRegistry(workflows: readonly Workflow[]): Registry {
  const byName = new Map<string, Workflow>();
  const tools = new Map<string, { tool: Tool; in: Workflow }>();
  const classes = new Map<string, { cls: ToolClass; in: Workflow }>();
  workflows.forEach((w, i) => {
    if (!isWorkflow(w)) throw new InvalidInputError('not a workflow: pass workflows made by defineWorkflow', `workflows[${i}]`);
    const twin = byName.get(w.name);
    if (twin) {
      throw new InvalidDefinitionError(`workflow name "${w.name}" is used twice: ${origin(twin)} and ${origin(w)}`, `workflows[${i}]`,
        { workflow: w.name, files: [twin.sourceFile, w.sourceFile] });
    }
    byName.set(w.name, w);
    for (const step of w.steps) {
      const t = tools.get(step.tool.name);
      if (t && t.tool !== step.tool) {
        throw new InvalidDefinitionError(`two different tools are named "${step.tool.name}": in ${origin(t.in)} and in ${origin(w)}`,
          `workflows[${i}].steps`, { tool: step.tool.name, workflows: [t.in.name, w.name] });
      }
      tools.set(step.tool.name, { tool: step.tool, in: w });
      const c = classes.get(step.tool.class.name);
      if (c && c.cls !== step.tool.class) {
        throw new InvalidDefinitionError(`two different tool classes are named "${step.tool.class.name}": in ${origin(c.in)} and in ${origin(w)}`,
          `workflows[${i}].steps`, { toolClass: step.tool.class.name, workflows: [c.in.name, w.name] });
      }
      classes.set(step.tool.class.name, { cls: step.tool.class, in: w });
    }
  });
  return Object.freeze({
    get: (name: string) => byName.get(name),
    require(name: string): Workflow {
      const w = byName.get(name);
      if (!w) {
        throw new InvalidInputError(`unknown workflow "${name}"`, 'workflow',
          { reason: 'unknown_workflow', workflow: name, known: [...byName.keys()].sort() });
      }
      return w;
    },
    list: () => [...byName.values()],
    tool: (name: string) => tools.get(name)?.tool,
    toolClasses: () => [...classes.values()].map((c) => c.cls).sort((a, b) => a.name.localeCompare(b.name)),
  });
}
