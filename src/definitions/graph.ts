import { InvalidDefinitionError } from '../errors.js';

/** What the graph check needs of a step: its name, its explicit `after` (if any) and whether it has a `when`. */
export interface GraphNode {
  name: string;
  after?: readonly string[];
  conditional: boolean;
}

/**
 * The dependencies of every step, by position: its explicit `after`; else the previous step, plus
 * what that step waits for when it is conditional (a `when`), so a skipped step in a sequence
 * does not skip the rest of it (a step whose dependencies were ALL skipped is skipped). The first
 * step, and a step with `after: []`, start with the run.
 */
export function resolveAfter(nodes: readonly GraphNode[]): string[][] {
  const out: string[][] = [];
  nodes.forEach((node, i) => {
    if (node.after) {
      out.push([...node.after]);
    } else if (i === 0) {
      out.push([]);
    } else {
      const prev = nodes[i - 1]!;
      out.push(prev.conditional ? unique([prev.name, ...out[i - 1]!]) : [prev.name]);
    }
  });
  return out;
}

const unique = (names: readonly string[]) => [...new Set(names)];

/**
 * Refuses a graph that cannot run, naming where: an `after` that names no step (or the step
 * itself, or one step twice), a cycle (with its path, `a -> b -> a`), a step no start reaches.
 * `where` is the workflow's path (`workflow[x]`); `after[i]` are the resolved dependencies.
 */
export function checkGraph(nodes: readonly GraphNode[], after: readonly (readonly string[])[], where: string): void {
  const index = new Map(nodes.map((n, i) => [n.name, i]));
  nodes.forEach((node, i) => {
    if (!node.after) return;
    const seen = new Set<string>();
    node.after.forEach((dep, j) => {
      const at = `${where}.steps[${i}].after[${j}]`;
      if (dep === node.name)
        throw new InvalidDefinitionError(`step "${node.name}" cannot wait for itself`, at, { step: node.name, cycle: [dep, dep] });
      if (!index.has(dep)) {
        throw new InvalidDefinitionError(
          `step "${node.name}" waits for "${dep}", which is no step of this workflow ` + `(steps: ${nodes.map((n) => n.name).join(', ')})`,
          at,
          { step: node.name, unknown: dep },
        );
      }
      if (seen.has(dep)) throw new InvalidDefinitionError(`step "${node.name}" names "${dep}" twice in after`, at, { step: node.name });
      seen.add(dep);
    });
  });
  const cycle = findCycle(
    nodes.map((n) => n.name),
    after,
    index,
  );
  if (cycle) {
    const first = index.get(cycle[0]!)!;
    throw new InvalidDefinitionError(`the steps wait for each other in a cycle: ${cycle.join(' -> ')}`, `${where}.steps[${first}].after`, {
      cycle,
    });
  }
  // Without a cycle every step is reached from a start, unless no step starts with the run.
  const reached = reachable(
    nodes.map((n) => n.name),
    after,
  );
  const lost = nodes.findIndex((n) => !reached.has(n.name));
  if (lost >= 0) {
    throw new InvalidDefinitionError(
      `step "${nodes[lost]!.name}" can never start: no step that starts with the run leads to it`,
      `${where}.steps[${lost}]`,
      { step: nodes[lost]!.name },
    );
  }
}

/**
 * A cycle as a path of names that starts and ends at the same step, or null. Depth-first over
 * "waits for" edges, in declaration order, so the same definition always reports the same path.
 */
function findCycle(names: readonly string[], after: readonly (readonly string[])[], index: Map<string, number>): string[] | null {
  const state = new Map<string, 'open' | 'done'>();
  const stack: string[] = [];
  const visit = (name: string): string[] | null => {
    state.set(name, 'open');
    stack.push(name);
    for (const dep of after[index.get(name)!] ?? []) {
      if (!index.has(dep)) continue;
      const s = state.get(dep);
      if (s === 'open') return [...stack.slice(stack.indexOf(dep)), dep].reverse();
      if (s === undefined) {
        const found = visit(dep);
        if (found) return found;
      }
    }
    stack.pop();
    state.set(name, 'done');
    return null;
  };
  for (const name of names) {
    if (state.has(name)) continue;
    const found = visit(name);
    if (found) return found;
  }
  return null;
}

/** The steps a start (a step that waits for nothing) leads to, itself included. */
function reachable(names: readonly string[], after: readonly (readonly string[])[]): Set<string> {
  const next = new Map<string, string[]>(names.map((n) => [n, []]));
  names.forEach((n, i) => after[i]!.forEach((dep) => next.get(dep)?.push(n)));
  const todo = names.filter((_, i) => after[i]!.length === 0);
  const seen = new Set(todo);
  while (todo.length > 0) {
    for (const n of next.get(todo.pop()!)!) {
      if (!seen.has(n)) {
        seen.add(n);
        todo.push(n);
      }
    }
  }
  return seen;
}
