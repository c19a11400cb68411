import type { Step, StepInputArgs, Workflow } from '../definitions/types.js';
import { toJsonText } from '../store/json.js';
import type { ClaimDecision, PersistedStage } from './decide.js';
import type { GraphNode, GraphStageSpec } from './graph.js';
import { concurrencyOf } from './plan.js';
import { guarded, plannerFailure } from './planner-error.js';

/**
 * A map's item stages are numbered `mapSeq × ITEM_SEQ_STRIDE + index`: fixed by the map and the
 * index alone, so two maps of one run expanding at once never pick the same numbers, and a
 * retried expansion picks the numbers it picked before. (Steps number at most MAX_STEPS = 2000 and
 * maxItems at most 999,999, so every seq stays below 2^31 and above every step's own seq.)
 */
export const ITEM_SEQ_STRIDE = 1_000_000;

export const itemSeq = (mapSeq: number, index: number): number => mapSeq * ITEM_SEQ_STRIDE + index;

/** Where in a static workflow's steps the step of a stage is: its own seq's, or for a map's item, its map's. */
export const stepIndexOf = (seq: number): number => (seq >= ITEM_SEQ_STRIDE ? Math.floor(seq / ITEM_SEQ_STRIDE) - 1 : seq - 1);

/** A map item's stage key: stable per run, step and index (a tool's own idempotencyKey(input) still names the effect). */
export const itemIdempotencyKey = (runId: string, step: string, index: number): string => `${runId}:${step}:${index}`;

/** The concurrency key that holds a map's maxParallel: one per run and step. */
export const mapConcurrencyKey = (runId: string, step: string): string => `${runId}:${step}`;

/**
 * A map step's first claim, pure: its list from the persisted results, then one stage per item
 * (queued, each with its own key and its input computed now, each feeding the map stage), bounded
 * by maxParallel through the concurrency-key machinery. An empty list ends the step at once with
 * `[]`; a list longer than maxItems fails it with `map_too_large`; items() that throws or returns
 * no array, or an item input that throws or is not JSON, fail it too (nothing inserted).
 */
export function expandMap(workflow: Workflow, runId: string, runInput: unknown, node: GraphNode, args: StepInputArgs): ClaimDecision {
  const step = node.step;
  const map = step.map!;
  const got = guarded('map_items_failed', `items() of step ${step.name}`, () => map.items(args));
  if (!got.ok) return got.fail;
  const list = got.value;
  if (!Array.isArray(list)) {
    return plannerFailure(
      'map_items_failed',
      `items() of step ${step.name} returned ${list === null ? 'null' : typeof list}, not an array`,
    );
  }
  if (list.length > map.maxItems) {
    return plannerFailure(
      'map_too_large',
      `step ${step.name} maps over ${list.length} items; at most ${map.maxItems} are allowed (map.maxItems)`,
      { items: list.length, maxItems: map.maxItems },
    );
  }
  if (list.length === 0) return { kind: 'done', result: [] };
  const cls = step.tool.class;
  const concurrency =
    map.maxParallel !== null
      ? { concurrencyKey: mapConcurrencyKey(runId, step.name), concurrencyLimit: map.maxParallel }
      : concurrencyOf(workflow, runInput);
  const items: GraphStageSpec[] = [];
  for (const [i, item] of list.entries()) {
    const input = map.input
      ? guarded('map_item_input_failed', `input() of step ${step.name} for item ${i}`, () => map.input!(item, i, args))
      : { ok: true as const, value: item as unknown };
    if (!input.ok) return input.fail;
    try {
      toJsonText(input.value ?? null, `${step.name}[${i}]`);
    } catch (err) {
      return plannerFailure('map_item_input_failed', `the input of step ${step.name} for item ${i} is not JSON: ${(err as Error).message}`);
    }
    items.push({
      seq: itemSeq(node.seq, i),
      name: `${step.name}[${i}]`,
      step: step.name,
      tool: step.tool.name,
      toolClass: cls.name,
      leaseMs: cls.leaseMs,
      timeoutMs: cls.timeoutMs,
      maxDurationMs: cls.maxDurationMs,
      maxAttempts: step.tool.retry.maxAttempts,
      state: 'queued',
      deps: [],
      nextSeqs: [node.seq],
      depsLeft: 0,
      continueOnError: step.continueOnError,
      sink: null,
      idempotencyKey: itemIdempotencyKey(runId, step.name, i),
      itemIndex: i,
      groupSeq: node.seq,
      ...concurrency,
      input: input.value ?? null,
    });
  }
  return { kind: 'expand', items };
}

/**
 * A map stage claimed again once its items have ended: their values in item order (a failed
 * item, kept as a value by continueOnError, is `{ ok: false, error }`). An item still open means
 * the stage was woken early: it waits again.
 */
export function gatherMap(step: Step, items: readonly PersistedStage[]): ClaimDecision {
  const ordered = [...items].sort((a, b) => (a.itemIndex ?? 0) - (b.itemIndex ?? 0));
  const values: unknown[] = [];
  for (const item of ordered) {
    if (item.state === 'succeeded') values.push(item.result ?? null);
    else if (item.state === 'failed' && step.continueOnError) values.push({ ok: false, error: item.error ?? null });
    else if (item.state === 'failed')
      throw new Error(`map ${step.name}: item ${item.itemIndex} failed for good without continueOnError, yet its run went on`);
    else return { kind: 'wait' };
  }
  return { kind: 'done', result: values };
}
