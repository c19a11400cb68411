import { InvalidDefinitionError, InvalidInputError } from '../errors.js';
import { isWorkflow } from './guards.js';
import { classesOf, toolsOf } from './agent.js';
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
    for (const tool of toolsOf(w)) {
      const t = tools.get(tool.name);
      if (t && t.tool !== tool) {
        throw new InvalidDefinitionError(`two different tools are named "${tool.name}": in ${origin(t.in)} and in ${origin(w)}`,
          `workflows[${i}].steps`, { tool: tool.name, workflows: [t.in.name, w.name] });
      }
      tools.set(tool.name, { tool, in: w });
    }
    for (const cls of classesOf(w)) {
      const c = classes.get(cls.name);
      if (c && c.cls !== cls) {
        throw new InvalidDefinitionError(`two different tool classes are named "${cls.name}": in ${origin(c.in)} and in ${origin(w)}`,
          `workflows[${i}].steps`, { toolClass: cls.name, workflows: [c.in.name, w.name] });
      }
      classes.set(cls.name, { cls, in: w });
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
