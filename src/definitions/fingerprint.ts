import { createHash } from 'node:crypto';
import { schemaFingerprint } from './json-schema.js';
import type { Step, Tool, ToolClass } from './types.js';

/** JSON with object keys sorted at every depth (undefined members dropped), so equal structures give equal text. */
export function canonicalJson(value: unknown): string {
  return JSON.stringify(sortKeys(value));
}

function sortKeys(value: unknown): unknown {
  if (Array.isArray(value)) return value.map((v) => (v === undefined ? null : sortKeys(v)));
  if (value !== null && typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const key of Object.keys(value).sort()) {
      const v = (value as Record<string, unknown>)[key];
      if (v !== undefined) out[key] = sortKeys(v);
    }
    return out;
  }
  return value;
}

export function toolClassFingerprint(c: ToolClass): Record<string, unknown> {
  return {
    name: c.name,
    leaseMs: c.leaseMs,
    heartbeatMs: c.heartbeatMs,
    timeoutMs: c.timeoutMs,
    maxDurationMs: c.maxDurationMs,
    missedHeartbeats: c.missedHeartbeats,
    jitterMs: c.jitterMs,
    isolation: c.isolation,
    retry: c.retry,
  };
}

/** A tool's structure: names, numbers, schemas and which optional functions it has, never their bodies. */
export function toolFingerprint(t: Tool): Record<string, unknown> {
  return {
    name: t.name,
    class: toolClassFingerprint(t.class),
    retry: t.retry,
    input: schemaFingerprint(t.input, 'input'),
    output: schemaFingerprint(t.output, 'output'),
    hasReconcile: typeof t.reconcile === 'function',
    hasIdempotencyKey: typeof t.idempotencyKey === 'function',
    // Only on workflow tools, so every other tool's fingerprint (and the hashes that contain it) stays what it was.
    ...(t.childWorkflow ? { childWorkflow: { name: t.childWorkflow.name, version: t.childWorkflow.version } } : {}),
    // Only on gated tools (issue 10), likewise: whether a call waits for a person changes what a run does.
    ...(t.approval ? { approval: { when: t.approval.when === true ? 'always' : 'function', timeoutMs: t.approval.timeoutMs } } : {}),
  };
}

/**
 * A declared workflow version in a hash's structure: absent for version 1 (the default), so the
 * hashes of unversioned definitions, and the runs that recorded them, stay what they were.
 */
export const versionField = (version: number): { workflowVersion?: number } => (version === 1 ? {} : { workflowVersion: version });

/**
 * A step's place in a graph (only for workflows that use one, so a plain sequence keeps the
 * hash it always had): its kind, what it waits for, whether it has a condition, and a map's or
 * child run's own settings.
 */
function graphFingerprint(s: Step): Record<string, unknown> {
  return {
    kind: s.kind,
    after: s.after,
    hasWhen: typeof s.when === 'function',
    continueOnError: s.continueOnError,
    ...(s.map ? { map: { maxParallel: s.map.maxParallel, maxItems: s.map.maxItems, hasInput: typeof s.map.input === 'function' } } : {}),
    ...(s.workflow ? { childWorkflow: { name: s.workflow.name, version: s.workflow.version } } : {}),
    ...(s.sleep ? { sleep: { ms: s.sleep.ms, hasUntil: typeof s.sleep.until === 'function' } } : {}),
    ...(s.signal
      ? {
          signal: {
            name: s.signal.name,
            schema: schemaFingerprint(s.signal.schema, 'input'),
            timeoutMs: s.signal.timeoutMs,
            hasOnTimeout: typeof s.signal.onTimeout === 'function',
          },
        }
      : {}),
  };
}

/**
 * sha256 (hex) of a workflow's structure and declared version: what a run records, so it is only
 * ever resumed by a worker that loaded this very definition.
 */
export function workflowHash(name: string, steps: readonly Step[], version = 1, graph = false): string {
  const structure = {
    version: 1,
    workflow: name,
    ...versionField(version),
    steps: steps.map((s) => ({
      name: s.name,
      hasInput: typeof s.input === 'function',
      tool: toolFingerprint(s.tool),
      ...(graph ? graphFingerprint(s) : {}),
    })),
  };
  return createHash('sha256').update(canonicalJson(structure)).digest('hex');
}
