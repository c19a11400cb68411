import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { owe } from './fixtures.js';
import { startApi, type Api } from './helpers.js';

/** The live stream on the embedded store: no LISTEN there, one shared poll wakes the streams. */
let api: Api;
beforeAll(async () => {
  api = await startApi({ streamHeartbeatMs: 500 });
  await api.ratchet.worker({ classes: ['quick'], pollIntervalMs: 50 }).start();
});
afterAll(async () => {
  await api?.close();
});

describe('GET /v1/runs/:id/stream on PGlite', () => {
  it('follows a run with a retry to its end: every event once, in order', async () => {
    owe('pglite-stream', 1);
    const { id } = await api.client.submit('flaky', { key: 'pglite-stream' });
    const seen: string[] = [];
    const types: string[] = [];
    for await (const e of api.client.watch(id)) {
      seen.push(e.id);
      types.push(e.type);
    }
    const table = (await api.client.events(id)).events;
    expect(seen).toEqual(table.map((e) => e.id));
    expect(types).toContain('retry_scheduled');
    expect(types.at(-1)).toBe('run_succeeded');
  });
});
