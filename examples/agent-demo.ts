/**
 * `npm start`: the invoice agent (workflows/invoice-agent.ts) end to end, in one process, with
 * no servers and no API key:
 *   - the example services (statement source + fenced case service) on a free loopback port;
 *   - a scripted OpenAI-compatible model on loopback (examples/invoice-agent-script.ts), unless
 *     OPENAI_BASE_URL and OPENAI_API_KEY are both set: then the real model (RATCHET_MODEL,
 *     default gpt-4o-mini) is asked instead;
 *   - Ratchet on the embedded store (PGlite) in a fresh temporary directory, removed at the end
 *     (RATCHET_DEMO_DATA_DIR=dir uses and keeps that directory instead), and one worker;
 *   - the task API on a free loopback port with a fresh bearer token (examples/demo-approval.ts).
 * It submits one run and prints each stage as it advances. create_case waits for a person's
 * approval: the demo prints the `ratchet approve` command and the HTTP call that decide it, then
 * approves it itself through that call (with --ask it waits for a person instead). Then the
 * model's answer, the cases at the case service, and a one-line summary. Exit 0 when the run
 * succeeded, 130 when interrupted (Ctrl-C), 2 on a bad argument, 1 otherwise.
 *   npm start [-- [--ask] [<invoiceId>]]   (default inv-42; ids starting with "missing-" do not exist)
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { performance } from 'node:perf_hooks';
import { join } from 'node:path';
import pino from 'pino';
import { startScriptedModel, type ScriptedModel } from '../src/agent/scripted-model.js';
import { textReporter } from '../src/cli/run/report.js';
import { watchRun } from '../src/cli/run/watch.js';
import { createRatchet, MODEL_STAGE_TOOL, type Ratchet, type RunView } from '../src/index.js';
import type { Worker } from '../src/worker/worker.js';
import invoiceAgent from '../workflows/invoice-agent.js';
import { handleGate, serveDemoApi, type DemoApi } from './demo-approval.js';
import { invoiceAgentScript } from './invoice-agent-script.js';
import { SERVICES_URL_ENV, startServices, type Services } from './services.js';

const args = process.argv.slice(2);
const ask = args.includes('--ask');
const unknownFlag = args.find((a) => a.startsWith('-') && a !== '--ask');
if (unknownFlag) {
  process.stderr.write(`agent demo: unknown option ${unknownFlag}\nusage: npm start [-- [--ask] [<invoiceId>]]\n`);
  process.exit(2);
}
const invoiceId = args.find((a) => !a.startsWith('-')) ?? 'inv-42';
const request = `Please reconcile invoice ${invoiceId}: check its statement of account and file a reconciliation case.`;
const realModel = Boolean(process.env.OPENAI_BASE_URL && process.env.OPENAI_API_KEY);
const keyWithoutURL = !realModel && Boolean(process.env.OPENAI_API_KEY);
const keptDir = process.env.RATCHET_DEMO_DATA_DIR || undefined;
const dataDir = keptDir ?? mkdtempSync(join(tmpdir(), 'ratchet-agent-demo-'));

const say = (line = '') => process.stdout.write(`${line}\n`);
const count = (n: number, one: string, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;
const report = textReporter((line) => process.stdout.write(line));
// Logs go to stderr, errors only: the stage lines below are the story (RATCHET_LOG_LEVEL=info shows the lease protocol).
const logger = pino({ name: 'ratchet', level: process.env.RATCHET_LOG_LEVEL ?? 'error' }, pino.destination(2));

// Ctrl-C stops watching and still cleans up (worker, servers, the temporary data directory).
const interrupt = new AbortController();
process.once('SIGINT', () => interrupt.abort());
process.once('SIGTERM', () => interrupt.abort());

const started = Date.now();
// RATCHET_DEMO_TIMINGS=1: where the start-up goes, on stderr, in ms since the process started (imports included).
const timings = process.env.RATCHET_DEMO_TIMINGS === '1';
const mark = (what: string) => {
  if (timings) process.stderr.write(`[timing] ${performance.now().toFixed(0).padStart(6)} ms  ${what}\n`);
};
mark('demo module loaded (node + tsx + imports)');
let services: Services | undefined;
let model: ScriptedModel | undefined;
let ratchet: Ratchet | undefined;
let worker: Worker | undefined;
let api: DemoApi | undefined;
say(`Ratchet agent demo: ${invoiceAgent.name}`);
try {
  // 1. Where everything is: the tools find the services, the model client finds the model.
  services = await startServices({ onError: (err) => process.stderr.write(`example services: ${(err as Error).message}\n`) });
  process.env[SERVICES_URL_ENV] = services.url;
  mark('services up (their PGlite, fence guard migrated)');
  say(`  services  ${services.url} (statement source, fenced case service)`);
  if (realModel) {
    say(`  model     ${invoiceAgent.agent!.model.name} at ${process.env.OPENAI_BASE_URL}`);
  } else {
    model = await startScriptedModel({ script: invoiceAgentScript });
    process.env.OPENAI_BASE_URL = model.baseURL;
    process.env.OPENAI_API_KEY = 'not-needed'; // a real key, if one is set, never goes to the stand-in
    say(`  model     scripted OpenAI-compatible server at ${model.baseURL} (no API key; see README for a real model)`);
    if (keyWithoutURL)
      say('            (OPENAI_API_KEY is set but OPENAI_BASE_URL is not: add OPENAI_BASE_URL=https://api.openai.com/v1 to use it)');
  }
  mark('model up');
  ratchet = await createRatchet({ workflows: [invoiceAgent], dataDir, logger });
  mark('ratchet created (its PGlite, migrations)');
  say(`  store     ${ratchet.store.kind === 'pglite' ? `embedded PGlite at ${dataDir}` : 'PostgreSQL (DATABASE_URL)'}`);
  api = await serveDemoApi(ratchet);
  mark('api up');
  say(`  api       ${api.url} (bearer token ${api.token}): where a person approves`);

  // 2. A worker serving every class (model, invoice-http, invoice-compute), and the run.
  worker = ratchet.worker();
  await worker.start();
  mark('worker started');
  const run = await ratchet.submit(invoiceAgent.name, { request });
  mark('run submitted');
  say(`run ${run.id}: "${request}"`);

  // 3. Each stage as it advances: the model's tool calls become stages, then the model again.
  //    A stage awaiting approval: how a person decides it, then the decision (the demo's, or the person's with --ask).
  const r = ratchet;
  const a = api;
  const gates = new Map<number, Promise<void>>();
  const decide = (seq: number, tool: string) =>
    handleGate(
      a,
      run.id,
      { seq, tool },
      {
        ask,
        say,
        signal: interrupt.signal,
        // RATCHET_DEMO_PROGRESS_MS: how often --ask says it still waits (default 15 s).
        ...(Number(process.env.RATCHET_DEMO_PROGRESS_MS) > 0 ? { progressEveryMs: Number(process.env.RATCHET_DEMO_PROGRESS_MS) } : {}),
      },
    )
      .then((line) => {
        if (line) say(`  decided: ${line}`);
      })
      .catch((err: unknown) => {
        process.stderr.write(`agent demo: deciding stage ${seq}: ${(err as Error).message}\n`);
      });
  const outcome = await watchRun((id) => r.getRun(id), run.id, {
    intervalMs: 50,
    // --ask: a person takes their time (the run's own deadline, 15m, still ends it).
    timeoutMs: (ask ? 20 : 5) * 60_000,
    signal: interrupt.signal,
    onStage: (s) => {
      if (s.seq === 1 && s.state === 'running') mark('stage 1 seen running');
      if (s.seq === 1 && s.state === 'succeeded') mark('stage 1 seen succeeded');
      report.stage(run.id, { ...s, tool: s.tool === MODEL_STAGE_TOOL ? 'model' : s.tool });
      if (s.state === 'awaiting_approval' && !gates.has(s.seq)) gates.set(s.seq, decide(s.seq, s.tool));
    },
  });
  await Promise.all(gates.values());
  mark('run finished');
  const final: RunView = outcome.run ?? (await ratchet.getRun(run.id))!;
  if (outcome.kind !== 'finished') say(`${outcome.kind === 'timeout' ? 'gave up waiting' : 'interrupted'}: the run is left ${final.state}`);

  // 4. The answer, what the case service holds (the witness of the side effect), a summary.
  say();
  if (final.state === 'succeeded') say(`answer: ${(final.result as { answer: string }).answer}`);
  else if (final.error) {
    const { code, message } = final.error as { code?: string; message?: string };
    say(`run ${final.state}: ${code ?? 'error'}: ${message ?? JSON.stringify(final.error)}`);
  }
  const { cases, requests } = await services.effects();
  say(`cases at the case service: ${cases.length}`);
  for (const c of cases) say(`  ${c.caseId}  invoice ${c.invoiceId}  ${c.outcome}  key ${c.key}  fence ${c.fence}`);
  const modelCalls = final.stages.filter((s) => s.tool === MODEL_STAGE_TOOL).length;
  const toolStages = final.stages.length - modelCalls;
  // An approved call is claimed again once it is approved: that attempt is the call itself, not a retry.
  const decisions = (await ratchet.events(run.id)).filter((e) => e.type === 'approval_granted' || e.type === 'approval_rejected');
  const approved = decisions.filter((e) => e.type === 'approval_granted').length;
  const retries = final.stages.reduce((n, s) => n + Math.max(0, s.attempt - 1), 0) - approved;
  say();
  const verdict = final.state === 'succeeded' ? 'ok' : outcome.kind === 'finished' ? 'FAILED' : 'stopped';
  say(
    `${verdict}: run ${final.state} in ${((Date.now() - started) / 1000).toFixed(1)}s — ` +
      `${count(modelCalls, 'model call')}${model ? ` (${count(model.requests.length, 'request')} to the scripted model)` : ''}, ` +
      `${count(toolStages, 'tool stage')}, ${decisions.length === 0 ? 'no approval asked' : `${count(decisions.length, 'approval')} (${approved === decisions.length ? 'granted' : approved === 0 ? 'rejected' : `${approved} granted`})`}, ${retries === 0 ? 'no retries' : count(retries, 'retry', 'retries')}, ` +
      `${count(cases.length, 'case')} filed (${count(requests.length, 'POST')} to the receiver)`,
  );
  if (keptDir) say(`the run is kept in ${keptDir}: node bin/ratchet.mjs --data-dir ${keptDir} events ${run.id}`);
  process.exitCode = final.state === 'succeeded' ? 0 : outcome.kind === 'interrupted' ? 130 : 1;
} catch (err) {
  process.stderr.write(`agent demo: ${(err as Error).message}\n`);
  process.exitCode = 1;
} finally {
  await worker?.stop({ graceMs: 5000 });
  await api?.close();
  await ratchet?.close();
  await model?.close();
  await services?.close();
  if (!keptDir) rmSync(dataDir, { recursive: true, force: true });
}
