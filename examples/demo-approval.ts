/**
 * The person's part of `npm start` (examples/agent-demo.ts): the demo serves the task API on
 * loopback with a fresh bearer token, and when create_case waits for approval it prints the CLI
 * command and the HTTP call that decide it. Then either it approves the call itself, through that
 * very API call (POST /v1/runs/:id/stages/:stageId/approve, as the client sends it), so the demo
 * runs unattended; or, with `--ask`, it waits for a person to decide, reading the run's
 * explanation until its verdict is no longer `awaiting_approval`.
 */
import { randomBytes } from 'node:crypto';
import { createServer, type ApiServer } from '../src/api/server.js';
import { createClient, type RatchetClient } from '../src/client/index.js';
import type { Ratchet } from '../src/index.js';

export interface DemoApi {
  readonly url: string;
  readonly token: string;
  readonly client: RatchetClient;
  close(): Promise<void>;
}

/** The task API over the demo's Ratchet, on a free loopback port; the embedded store is one process's, so a person reaches it here. */
export async function serveDemoApi(ratchet: Ratchet): Promise<DemoApi> {
  const token = `demo-${randomBytes(12).toString('hex')}`;
  const server: ApiServer = await createServer({ ratchet, tokens: [token], port: 0 });
  return { url: server.url, token, client: createClient({ baseUrl: server.url, token }), close: () => server.close() };
}

export interface Gate {
  seq: number;
  tool: string;
}

const sleep = (ms: number, signal: AbortSignal) =>
  new Promise<void>((resolve) => {
    const done = () => {
      clearTimeout(t);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const t = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
  });

/**
 * One stage that waits for a person: prints how to decide it, then decides it (`ask` false) or
 * waits for the decision (`ask` true), printing progress. Returns the decision as a line, or null
 * when interrupted.
 */
export async function handleGate(
  api: DemoApi,
  runId: string,
  gate: Gate,
  o: { ask: boolean; say: (line?: string) => void; signal: AbortSignal; progressEveryMs?: number },
): Promise<string | null> {
  const { say } = o;
  const pending = (await api.client.approvals({ runId })).approvals.find((a) => a.seq === gate.seq);
  if (!pending) return null; // decided already (by someone quicker than this read)
  const cli = `node bin/ratchet.mjs approve ${runId} --stage ${pending.stageId} --url ${api.url} --token ${api.token}`;
  const path = `/v1/runs/${runId}/stages/${pending.stageId}/approve`;
  say(`  stage ${gate.seq} ${gate.tool} waits for a person's approval (no lease, no worker held). To approve it:`);
  say(`    ${cli}`);
  say(`    curl -X POST -H 'Authorization: Bearer ${api.token}' ${api.url}${path}`);
  say(
    `    (to refuse it: node bin/ratchet.mjs reject ... --reason '<why>', or POST .../reject with {"reason":"<why>"}; the model hears why)`,
  );

  if (!o.ask) {
    say('  approving it now through that API call, as a person would (npm start -- --ask waits for you instead)');
    const d = await api.client.approve(runId, { stageId: pending.stageId, by: 'npm start', reason: 'the demo approves unattended' });
    return `${gate.tool} approved by ${d.decidedBy} (${d.actor}): queued, it runs once`;
  }

  say('  waiting for your decision (Ctrl-C stops; the run would stay waiting)...');
  const started = Date.now();
  let next = started + (o.progressEveryMs ?? 15_000);
  while (!o.signal.aborted) {
    const ex = await api.client.explain(runId);
    if (ex.verdict !== 'awaiting_approval') {
      const { events } = await api.client.events(runId, { limit: 1000 });
      const decided = events.find(
        (e) => (e.type === 'approval_granted' || e.type === 'approval_rejected') && e.stageId === pending.stageId,
      );
      if (!decided) return `${gate.tool}: no longer awaiting approval (${ex.verdict})`;
      const d = (decided.data ?? {}) as { decidedBy?: string; actor?: string | null; reason?: string | null };
      const who = `${d.decidedBy}${d.actor ? ` (${d.actor})` : ''}`;
      return decided.type === 'approval_granted'
        ? `${gate.tool} approved by ${who}: queued, it runs once`
        : `${gate.tool} rejected by ${who}${d.reason ? `: "${d.reason}"` : ''}; the model hears it as the tool's answer`;
    }
    if (Date.now() >= next) {
      say(
        `  still awaiting approval after ${Math.round((Date.now() - started) / 1000)} s (explain: ${ex.verdict}; nothing is leased meanwhile)`,
      );
      next += o.progressEveryMs ?? 15_000;
    }
    await sleep(250, o.signal);
  }
  return null;
}
