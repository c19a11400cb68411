import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { createRatchet, type Ratchet } from '../../src/engine.js';
import { PermanentError, TransientError } from '../../src/errors.js';
import { silentLogger } from '../../src/logger.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { startWitness, type Witness } from '../helpers/witness.js';

/**
 * Two runs that share a semantic idempotency key (the same invoice submitted twice at once),
 * on PostgreSQL, through the fenced witness. Both stages are claimed before either sends, so
 * their fences are known; the later claim (higher fence) sends first and applies, then the
 * earlier claim (lower fence) sends: the effect is done, so it gets the stored answer, and
 * both runs succeed with one effect.
 */
let db: TestDatabase;
let witness: Witness;
let ratchet: Ratchet;

const claimed: { fence: bigint; go: () => void }[] = [];
const sent: { fence: string; status: number }[] = [];
let higherSent!: () => void;
const higherDone = new Promise<void>((r) => {
  higherSent = r;
});

const io = defineToolClass({
  name: 'invoice_io',
  lease: '3s',
  heartbeat: '1s',
  jitter: '200ms',
  timeout: '20s',
  maxDuration: '30s',
  retry: { maxAttempts: 1 },
});
const fileInvoice = defineTool({
  name: 'file_invoice',
  description: 'files an invoice downstream, keyed by what it means',
  class: io,
  input: z.object({ invoice: z.string() }),
  output: z.object({ status: z.number() }),
  idempotencyKey: (i) => `invoice:${i.invoice}:file`,
  run: async (i, ctx) => {
    // Wait until both runs' stages hold a lease, then send in the order that used to fail: higher fence first.
    await new Promise<void>((go) => {
      claimed.push({ fence: BigInt(ctx.fence), go });
      if (claimed.length === 2) {
        const [low, high] = [...claimed].sort((a, b) => (a.fence < b.fence ? -1 : 1));
        high!.go();
        void higherDone.then(() => low!.go());
      }
    });
    ctx.beginEffect(`file-${i.invoice}`);
    const res = await fetch(`${witness.url}/effect`, {
      method: 'POST',
      body: JSON.stringify({ invoice: i.invoice }),
      signal: ctx.signal,
      headers: { 'content-type': 'application/json', 'idempotency-key': ctx.idempotencyKey, 'x-execution-fence': ctx.fence },
    });
    const body = await res.text();
    sent.push({ fence: ctx.fence, status: res.status });
    if (sent.length === 1) higherSent();
    if (res.status >= 500) throw new TransientError(`receiver ${res.status}`);
    if (res.status >= 400) throw new PermanentError(`receiver refused: ${res.status} ${body}`, { code: 'receiver_refused' });
    return { status: res.status };
  },
});
const workflow = defineWorkflow({ name: 'file_invoice', input: z.object({ invoice: z.string() }), steps: [{ tool: fileInvoice }] });

beforeAll(async () => {
  db = await createTestDatabase('receiver_semantic');
  witness = await startWitness(db.url);
  ratchet = await createRatchet({ databaseUrl: db.url, workflows: [workflow], logger: silentLogger() });
});
afterAll(async () => {
  await ratchet?.close();
  await witness?.close();
  await db?.drop();
});

describe('two runs sharing a semantic idempotency key', () => {
  it('both succeed with one effect, whichever fence sends first', async () => {
    const a = await ratchet.submit('file_invoice', { invoice: 'INV-42' });
    const b = await ratchet.submit('file_invoice', { invoice: 'INV-42' });
    await ratchet.worker({ concurrency: 2, pollIntervalMs: 50 }).start();
    const settled = async () => {
      const end = Date.now() + 30_000;
      for (;;) {
        const runs = await Promise.all([ratchet.getRun(a.id), ratchet.getRun(b.id)]);
        if (runs.every((r) => r && ['succeeded', 'failed', 'cancelled', 'expired'].includes(r.state))) return runs;
        if (Date.now() > end) throw new Error(`runs not settled: ${runs.map((r) => r?.state).join(', ')}`);
        await new Promise((r) => setTimeout(r, 25));
      }
    };
    const runs = await settled();
    expect(runs.map((r) => [r?.state, r?.error])).toEqual([
      ['succeeded', null],
      ['succeeded', null],
    ]);
    expect(BigInt(sent[0]!.fence)).toBeGreaterThan(BigInt(sent[1]!.fence)); // the higher fence really sent first
    expect(sent.map((s) => s.status)).toEqual([201, 201]);
    expect(witness.requests.map((r) => r.verdict)).toEqual(['applied', 'replayed']);
    expect(await witness.appliedPerKey()).toEqual(new Map([['invoice:INV-42:file', 1]]));
  });
});
