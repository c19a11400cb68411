import { InvalidDefinitionError, InvalidInputError } from '../errors.js';
import { isWorkflow } from './guards.js';
import { classesOf, toolsOf } from './agent.js';
import type { Tool, ToolClass, Workflow } from './types.js';

export interface Registry {
  /** A workflow by name: the newest loaded version (the highest `version`), or the one asked for. */
  get(name: string, version?: number): Workflow | undefined;
  /**
   * The same, or an InvalidInputError (code `invalid_input`, `details.reason` `unknown_workflow`,
   * or `unknown_version` with the loaded versions).
   */
  require(name: string, version?: number): Workflow;
  /** The definition a run started with, by the hash it recorded (any loaded version). */
  byHash(hash: string): Workflow | undefined;
  /** Every loaded definition, every version: by name, newest version first. */
  list(): Workflow[];
  /** Hashes of the loaded definitions (every version) that have stages of `toolClass`. */
  hashesOf(toolClass: string): string[];
  tool(name: string): Tool | undefined;
  toolClasses(): ToolClass[];
}

function origin(w: Workflow): string {
  const v = w.version === 1 ? '' : ` version ${w.version}`;
  return w.sourceFile ? `workflow "${w.name}"${v} (${w.sourceFile})` : `workflow "${w.name}"${v}`;
}

/**
 * Workflows (several versions of one name may be loaded side by side), tools and classes by
 * name. One name means one tool (or tool class) across the newest version of every workflow;
 * an older version kept loaded for its in-flight runs may hold an older definition of a tool
 * or class, which is used for its own stages (the executor resolves a stage through its run's
 * definition hash), while the newest definition of a class sets the worker's limits.
 */
export function createRegistry(workflows: readonly Workflow[]): Registry {
  const versions = new Map<string, Map<number, Workflow>>();
  const byHash = new Map<string, Workflow>();
  workflows.forEach((w, i) => {
    if (!isWorkflow(w)) throw new InvalidInputError('not a workflow: pass workflows made by defineWorkflow', `workflows[${i}]`);
    const ofName = versions.get(w.name) ?? new Map<number, Workflow>();
    const twin = ofName.get(w.version);
    if (twin) {
      const what =
        w.version === 1 ? `workflow name "${w.name}" is used twice` : `version ${w.version} of workflow "${w.name}" is declared twice`;
      throw new InvalidDefinitionError(`${what}: ${origin(twin)} and ${origin(w)}`, `workflows[${i}]`, {
        workflow: w.name,
        version: w.version,
        files: [twin.sourceFile, w.sourceFile],
      });
    }
    ofName.set(w.version, w);
    versions.set(w.name, ofName);
    byHash.set(w.hash, w);
  });
  const all = [...versions.keys()].sort().flatMap((name) => [...versions.get(name)!.values()].sort((a, b) => b.version - a.version));
  const newest = new Set([...versions.values()].map((ofName) => [...ofName.values()].reduce((a, b) => (b.version > a.version ? b : a))));

  const tools = new Map<string, { tool: Tool; in: Workflow }>();
  const classes = new Map<string, { cls: ToolClass; in: Workflow }>();
  // The newest versions first, checked against each other; older versions only fill names the newest do not use.
  for (const w of [...all.filter((x) => newest.has(x)), ...all.filter((x) => !newest.has(x))]) {
    const strict = newest.has(w);
    const at = `workflows[${workflows.indexOf(w)}]`;
    for (const tool of toolsOf(w)) {
      const t = tools.get(tool.name);
      if (t && t.tool !== tool && strict) {
        throw new InvalidDefinitionError(
          `two different tools are named "${tool.name}": in ${origin(t.in)} and in ${origin(w)}`,
          `${at}.steps`,
          { tool: tool.name, workflows: [t.in.name, w.name] },
        );
      }
      if (!t) tools.set(tool.name, { tool, in: w });
    }
    for (const cls of classesOf(w)) {
      const c = classes.get(cls.name);
      if (c && c.cls !== cls && strict) {
        throw new InvalidDefinitionError(
          `two different tool classes are named "${cls.name}": in ${origin(c.in)} and in ${origin(w)}`,
          `${at}.steps`,
          { toolClass: cls.name, workflows: [c.in.name, w.name] },
        );
      }
      if (!c) classes.set(cls.name, { cls, in: w });
    }
  }

  checkChildWorkflows(workflows, versions);

  const get = (name: string, version?: number): Workflow | undefined => {
    const ofName = versions.get(name);
    if (!ofName) return undefined;
    return version === undefined ? all.find((w) => w.name === name) : ofName.get(version);
  };
  return Object.freeze({
    get,
    require(name: string, version?: number): Workflow {
      const w = get(name, version);
      if (w) return w;
      const ofName = versions.get(name);
      if (!ofName) {
        throw new InvalidInputError(`unknown workflow "${name}"`, 'workflow', {
          reason: 'unknown_workflow',
          workflow: name,
          known: [...versions.keys()].sort(),
        });
      }
      const loaded = [...ofName.keys()].sort((a, b) => a - b);
      throw new InvalidInputError(`workflow "${name}" has no loaded version ${version} (loaded: ${loaded.join(', ')})`, 'version', {
        reason: 'unknown_version',
        workflow: name,
        version,
        loaded,
      });
    },
    byHash: (hash: string) => byHash.get(hash),
    list: () => [...all],
    hashesOf: (toolClass: string) => all.filter((w) => classesOf(w).some((c) => c.name === toolClass)).map((w) => w.hash),
    tool: (name: string) => tools.get(name)?.tool,
    toolClasses: () => [...classes.values()].map((c) => c.cls).sort((a, b) => a.name.localeCompare(b.name)),
  });
}

/**
 * Every child-run step (and every workflow tool of an agent) names a loaded workflow (and version, when it names one), and no workflow
 * starts itself through its children (a cycle would start runs without end): refused at load,
 * naming the step and the path of the cycle.
 */
function checkChildWorkflows(workflows: readonly Workflow[], versions: Map<string, Map<number, Workflow>>): void {
  const children = (w: Workflow) => [
    ...w.steps.flatMap((s, j) => (s.workflow ? [{ spec: s.workflow, at: `steps[${j}].workflow` }] : [])),
    ...(w.agent?.tools ?? []).flatMap((t, j) => (t.childWorkflow ? [{ spec: t.childWorkflow, at: `tools[${j}]` }] : [])),
  ];
  workflows.forEach((w, i) => {
    for (const { spec, at } of children(w)) {
      const ofName = versions.get(spec.name);
      const where = `workflows[${i}].${at}`;
      if (!ofName) {
        throw new InvalidDefinitionError(
          `${origin(w)} starts child workflow "${spec.name}", which is not loaded ` + `(loaded: ${[...versions.keys()].sort().join(', ')})`,
          where,
          { workflow: w.name, child: spec.name },
        );
      }
      if (spec.version !== null && !ofName.has(spec.version)) {
        throw new InvalidDefinitionError(
          `${origin(w)} starts version ${spec.version} of "${spec.name}", which is not loaded ` +
            `(loaded: ${[...ofName.keys()].sort((a, b) => a - b).join(', ')})`,
          where,
          { workflow: w.name, child: spec.name, version: spec.version },
        );
      }
    }
  });
  // A cycle by name (any version): depth-first over "starts a child of" edges.
  const byName = new Map<string, Workflow[]>();
  for (const w of workflows) byName.set(w.name, [...(byName.get(w.name) ?? []), w]);
  const state = new Map<string, 'open' | 'done'>();
  const path: string[] = [];
  const visit = (name: string): void => {
    state.set(name, 'open');
    path.push(name);
    for (const w of byName.get(name) ?? []) {
      for (const { spec, at } of children(w)) {
        const s = state.get(spec.name);
        if (s === 'open') {
          const cycle = [...path.slice(path.indexOf(spec.name)), spec.name];
          throw new InvalidDefinitionError(
            `child runs would start each other without end: ${cycle.join(' -> ')}`,
            `workflows[${workflows.indexOf(w)}].${at}`,
            { cycle },
          );
        }
        if (s === undefined) visit(spec.name);
      }
    }
    path.pop();
    state.set(name, 'done');
  };
  for (const name of byName.keys()) if (!state.has(name)) visit(name);
}
