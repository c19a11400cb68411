import type { Step, Workflow } from '../definitions/types.js';
import { concurrencyOf } from './plan.js';

/**
 * The run graph of a static workflow, pure: one stage per step, numbered by position (seq =
 * index + 1), with what it waits for (`deps`), what waits for it (`nextSeqs`, precomputed so a
 * finish needs no graph walk: it decrements their join counters), and its ancestors (the steps
 * whose results its input, `when` and map items may read: all of them are done when it starts,
 * so any worker computes the same input after any crash).
 */
export interface GraphNode {
  seq: number;
  step: Step;
  /** The seqs this stage waits for (its join counter starts at their number). */
  deps: number[];
  /** The seqs that wait for this stage. */
  nextSeqs: number[];
  /** Names of every step this one waits for, directly or not. */
  ancestors: ReadonlySet<string>;
}

export interface RunGraph {
  nodes: readonly GraphNode[];
  bySeq: ReadonlyMap<number, GraphNode>;
  byName: ReadonlyMap<string, GraphNode>;
  /** Stages nothing waits for: the run succeeds when all of them have ended (succeeded, skipped, or failed as a value). */
  sinks: readonly number[];
}

const graphs = new WeakMap<Workflow, RunGraph>();

/** The graph of a static workflow (computed once per definition). */
export function runGraph(workflow: Workflow): RunGraph {
  const known = graphs.get(workflow);
  if (known) return known;
  const seqOf = new Map(workflow.steps.map((s, i) => [s.name, i + 1]));
  const nodes: GraphNode[] = workflow.steps.map((step, i) => ({
    seq: i + 1,
    step,
    deps: step.after.map((n) => seqOf.get(n)!),
    nextSeqs: [],
    ancestors: new Set<string>(),
  }));
  for (const n of nodes) for (const d of n.deps) nodes[d - 1]!.nextSeqs.push(n.seq);
  // Ancestors in an order where every dependency comes first (definitions refuse cycles).
  const done = new Set<number>();
  const visit = (n: GraphNode): void => {
    if (done.has(n.seq)) return;
    const anc = n.ancestors as Set<string>;
    for (const d of n.deps) {
      const dep = nodes[d - 1]!;
      visit(dep);
      anc.add(dep.step.name);
      for (const a of dep.ancestors) anc.add(a);
    }
    done.add(n.seq);
  };
  nodes.forEach(visit);
  const graph: RunGraph = {
    nodes,
    bySeq: new Map(nodes.map((n) => [n.seq, n])),
    byName: new Map(nodes.map((n) => [n.step.name, n])),
    sinks: nodes.filter((n) => n.nextSeqs.length === 0).map((n) => n.seq),
  };
  graphs.set(workflow, graph);
  return graph;
}

/**
 * One planned stage of a graph run: what the store's createRun / finish insert. `depsLeft` is
 * the join counter (a finish of a dependency decrements it; the one that brings it to 0 queues
 * the stage, exactly once under the counter's row lock). `sink`: how the stage's value enters
 * the run's result when the run has one sink (`only`: it is the result) or several (`one_of`:
 * the result is an object by step name); null for a stage something waits for.
 */
export interface GraphStageSpec {
  seq: number;
  /** The step's name; map item stages are named `step[i]`. */
  name: string;
  /** The step this stage belongs to (for a map item: the map step). */
  step: string;
  tool: string;
  toolClass: string;
  leaseMs: number;
  timeoutMs: number;
  maxDurationMs: number;
  maxAttempts: number;
  state: 'queued' | 'pending';
  deps: number[];
  nextSeqs: number[];
  depsLeft: number;
  continueOnError: boolean;
  sink: 'only' | 'one_of' | null;
  idempotencyKey?: string;
  itemIndex?: number;
  /** A map item's map stage (the stage that gathers it). */
  groupSeq?: number;
  concurrencyKey?: string;
  concurrencyLimit?: number;
  input?: unknown;
}

/**
 * A static graph run's plan at submit: every step's stage, those that wait for nothing queued,
 * the rest pending with their join counter. Inputs are computed when each stage is claimed
 * (decideAtClaim), from the persisted results of its ancestors. `sinksLeft` starts the run's
 * own counter: the finish that brings it to 0 ends the run.
 */
export function planGraphRun(workflow: Workflow, input: unknown): { stages: GraphStageSpec[]; sinksLeft: number } {
  const graph = runGraph(workflow);
  const concurrency = concurrencyOf(workflow, input);
  const sink = graph.sinks.length === 1 ? 'only' : 'one_of';
  const stages = graph.nodes.map((n): GraphStageSpec => {
    const cls = n.step.tool.class;
    return {
      seq: n.seq,
      name: n.step.name,
      step: n.step.name,
      tool: n.step.tool.name,
      toolClass: cls.name,
      leaseMs: cls.leaseMs,
      timeoutMs: cls.timeoutMs,
      maxDurationMs: cls.maxDurationMs,
      maxAttempts: n.step.tool.retry.maxAttempts,
      state: n.deps.length === 0 ? 'queued' : 'pending',
      deps: [...n.deps],
      nextSeqs: [...n.nextSeqs],
      depsLeft: n.deps.length,
      continueOnError: n.step.continueOnError,
      sink: n.nextSeqs.length === 0 ? sink : null,
      ...concurrency,
    };
  });
  return { stages, sinksLeft: graph.sinks.length };
}

/**
 * The fast path's question: the one stage that waits for `seq` and for nothing else, if `seq`
 * has exactly one successor (a linear stretch). A fan-out or a join returns null: those are
 * queued by the finish and woken through the transport.
 */
export function linearSuccessor(workflow: Workflow, seq: number): number | null {
  const graph = runGraph(workflow);
  const node = graph.bySeq.get(seq);
  if (!node || node.nextSeqs.length !== 1) return null;
  const next = graph.bySeq.get(node.nextSeqs[0]!)!;
  return next.deps.length === 1 ? next.seq : null;
}
