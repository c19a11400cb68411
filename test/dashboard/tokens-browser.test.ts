import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { startScriptedModel, type ScriptedModel } from '../../src/agent/scripted-model.js';
import { createServer, type ApiServer } from '../../src/api/server.js';
import { createClient } from '../../src/client/index.js';
import { defineAgent } from '../../src/definitions/agent.js';
import { defineTool, defineToolClass } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { silentLogger } from '../../src/logger.js';
import { artefactPath, launchBrowser, type Browser } from '../helpers/browser.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';

/**
 * The dashboard's run page in headless Chromium while a streaming model answers: the streamed
 * pieces show up live (by size, never the text) while the model call is held open, then the page
 * follows the run to its end and shows the run's tokens and cost. Screenshot in test-artefacts/.
 */
const TOKEN = 'dash-tokens-0123456789';
const SECRET_WORD = 'zebra-canary-7731';
const ANSWER = `The answer streams word by word, ${SECRET_WORD} included, then is stored once.`;
let db: TestDatabase;
let model: ScriptedModel;
let ratchet: Ratchet;
let server: ApiServer;
let browser: Browser;
/** A latch, set before the submit: released before the model's request arrives, the answer does not wait. */
let start: Promise<void> = Promise.resolve();
let releaseStart: () => void = () => {};
let releaseRest: () => void = () => {};
let holding = false;

const llm = defineToolClass({ name: 'dt-llm', lease: '5s', heartbeat: '1s', jitter: '200ms', timeout: '20s', maxDuration: '60s' });
const noop = defineTool({
  name: 'noop',
  description: 'nothing',
  class: llm,
  input: z.object({}),
  output: z.object({}),
  run: async () => ({}),
});
const bounded = (p: Promise<void>) => Promise.race([p, new Promise<void>((r) => setTimeout(r, 15_000))]);

beforeAll(async () => {
  db = await createTestDatabase('dashboard_tokens');
  model = await startScriptedModel({
    script: () => ({ content: ANSWER, usage: { prompt_tokens: 1200, completion_tokens: 300 } }),
    beforeAnswer: async () => {
      if (holding) await bounded(start);
    },
    afterChunk: async (_i, chunk) => {
      if (holding && chunk === 0) await bounded(new Promise<void>((r) => (releaseRest = r)));
    },
  });
  const agent = defineAgent({
    name: 'dash_streamer',
    input: z.object({ ask: z.string() }),
    model: {
      name: 'scripted-dash',
      class: llm,
      baseURL: model.baseURL,
      stream: true,
      pricing: { inputPerMillion: 3, outputPerMillion: 15 },
    },
    instructions: 'answer',
    tools: [noop],
  });
  ratchet = await createRatchet({ databaseUrl: db.url, workflows: [agent], logger: silentLogger() });
  await ratchet.worker({ pollIntervalMs: 50 }).start();
  server = await createServer({ ratchet, tokens: [TOKEN], port: 0, streamHeartbeatMs: 1000 });
  // A first watched run opens the API's token LISTEN (it stays), so the run under test races nothing.
  const client = createClient({ baseUrl: server.url, token: TOKEN });
  const warm = await client.submit('dash_streamer', { ask: 'warm' });
  for await (const _e of client.watch(warm.id, { onToken: () => {} })) {
    /* to the end */
  }
  browser = await launchBrowser();
}, 120_000);
afterAll(async () => {
  holding = false;
  releaseStart();
  releaseRest();
  await browser?.close();
  await server?.close();
  await ratchet?.close();
  await model?.close();
  await db?.drop();
});

describe('dashboard: streamed model tokens and the run cost', () => {
  it('pieces show live (by size) while the call is open; the finished run shows tokens and cost', async () => {
    const page = await browser.context.newPage();
    const failures: string[] = [];
    page.on('pageerror', (e) => failures.push(e.message));
    await page.goto(`${server.url}/`);
    await page.fill('input[name=token]', TOKEN);
    await page.click('button[type=submit]');
    await page.waitForSelector('table.runs');

    holding = true;
    start = new Promise<void>((r) => (releaseStart = r));
    const { id } = await createClient({ baseUrl: server.url, token: TOKEN }).submit('dash_streamer', { ask: 'go' });
    await page.goto(`${server.url}/runs/${id}`);
    await expect.poll(() => page.textContent('#live')).toBe('live');
    releaseStart(); // the model starts answering; it holds after its first piece
    await page.waitForSelector('#tokens', { timeout: 15_000 });
    expect(await page.textContent('#tokens')).toMatch(/model answering \(stage 1, attempt 1\): \d+ characters streamed in \d+ piece\(s\)/);
    // Polled: the first piece redraws the panel (its events may still be held back on the stream).
    await expect.poll(() => page.getAttribute('#panel', 'data-state')).toBe('running');
    await page.screenshot({ path: artefactPath('dashboard-tokens-streaming.png'), fullPage: true });
    holding = false;
    releaseRest();

    await expect.poll(() => page.getAttribute('#panel', 'data-state'), { timeout: 15_000 }).toBe('succeeded');
    await expect.poll(() => page.textContent('#tokens')).toContain(`${ANSWER.length} characters`);
    // 1200 × 3 / 1e6 + 300 × 15 / 1e6 = 0.0081
    await expect.poll(() => page.textContent('#run-usage')).toBe('1200 tokens in, 300 out, 1 call(s), cost 0.0081');
    // The dashboard shows sizes, never the model's text.
    expect(await page.content()).not.toContain(SECRET_WORD);
    await page.screenshot({ path: artefactPath('dashboard-tokens-done.png'), fullPage: true });
    expect(failures).toEqual([]);
  });
});
