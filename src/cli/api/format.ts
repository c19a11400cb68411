import type { EventListJson, RunJson, RunListJson } from '../../api/schemas.js';
import type { Explanation } from '../../observability/explanation.js';

/** Text for people (the --json forms are the API's own JSON). Errors show code and message; inputs are never printed. */
export const errorText = (e: unknown): string => {
  const { code, message } = (e ?? {}) as { code?: unknown; message?: unknown };
  if (typeof message === 'string') return `${typeof code === 'string' ? `${code}: ` : ''}${message}`;
  return JSON.stringify(e);
};

/**
 * A stage's dependencies by step name (the run graph: `deps` are seqs of the same run), in the
 * order given; a seq with no stage row shows as its number. '-' when it waits for nothing.
 */
export function depNames(deps: readonly number[] | undefined, stages: readonly { seq: number; name: string }[]): string[] {
  return (deps ?? []).map((d) => stages.find((s) => s.seq === d)?.name ?? String(d));
}
export const depsText = (names: readonly string[]): string => (names.length > 0 ? names.join(',') : '-');

export function formatRun(r: RunJson): string {
  const lines = [
    `run ${r.id} ${r.workflow} ${r.state}  created ${r.createdAt}${r.finishedAt ? `  finished ${r.finishedAt}` : ''}${r.deadline ? `  deadline ${r.deadline}` : ''}`,
  ];
  for (const s of r.stages) {
    let line = `  stage ${s.seq} ${s.name.padEnd(18)} ${s.state.padEnd(9)} attempt ${s.attempt}/${s.maxAttempts}  fence ${s.fence ?? '-'}`;
    line += `  deps ${depsText(depNames(s.deps, r.stages))}`;
    if (s.effectKey) line += `  key ${s.effectKey}`;
    if (s.state === 'running') line += `  lease until ${s.leaseUntil ?? '-'}  heartbeat ${s.heartbeatAt ?? '-'}`;
    if (s.state === 'queued' && Date.parse(s.availableAt) > Date.now()) line += `  retry at ${s.availableAt}`;
    if (s.lastError && s.state !== 'succeeded') line += `  (${errorText(s.lastError)})`;
    lines.push(line);
  }
  if (r.usage && r.usage.modelCalls > 0)
    lines.push(
      `model usage: ${r.usage.inputTokens} tokens in, ${r.usage.outputTokens} out, ${r.usage.modelCalls} calls` +
        (r.usage.cost !== undefined ? `, cost ${Number(r.usage.cost.toFixed(6))}` : ''),
    );
  if (r.traceId) lines.push(`trace: ${r.traceId}`);
  if (r.state === 'succeeded') lines.push(`result: ${JSON.stringify(r.result)}`);
  else if (r.error) lines.push(`error: ${errorText(r.error)}`);
  return lines.join('\n');
}

export function formatRunList(l: RunListJson): string {
  if (l.runs.length === 0) return 'no runs';
  const lines = l.runs.map(
    (r) => `${r.id}  ${r.workflow.padEnd(20)} ${r.state.padEnd(9)} ${r.createdAt}${r.error ? `  ${errorText(r.error)}` : ''}`,
  );
  if (l.nextCursor) lines.push(`more: --cursor ${l.nextCursor}`);
  return lines.join('\n');
}

export function formatEvents(e: EventListJson): string {
  if (e.events.length === 0) return 'no events';
  const lines = e.events.map(
    (ev) =>
      `${ev.at}  ${ev.type.padEnd(22)} ${ev.stageId ? `stage ${ev.stageId}` : '        '}` +
      `${ev.attempt !== null ? `  attempt ${ev.attempt}` : ''}${ev.fence ? `  fence ${ev.fence}` : ''}`,
  );
  if (e.nextCursor) lines.push(`more: --after ${e.nextCursor}`);
  return lines.join('\n');
}

export function formatExplanation(x: Explanation): string {
  const lines = [`${x.verdict}: ${x.summary}`];
  for (const [k, v] of Object.entries(x.evidence)) lines.push(`  ${k}: ${typeof v === 'string' ? v : JSON.stringify(v)}`);
  lines.push(`  (checked at ${x.checkedAt})`);
  return lines.join('\n');
}
