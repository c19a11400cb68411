/**
 * The invoice workflow end to end, offline, through the API: the example services in this
 * process (in-memory PGlite behind the fence guard), Ratchet on an in-memory embedded store,
 * one worker. The run is then resubmitted as a new run: its file_case stage derives the same
 * idempotency key, so the case service replays the first case instead of filing a second.
 *   npx tsx examples/run-demo.ts [invoiceId]
 * (The CLI does the same with `ratchet run reconcile-invoice --input '{"invoiceId":"inv-42"}' --with-services`.)
 */
import { fileURLToPath } from 'node:url';
import { createRatchet, silentLogger, type Ratchet, type RunView } from '../src/index.js';
import { startServices } from './services.js';

const invoiceId = process.argv[2] ?? 'inv-42';

async function finished(ratchet: Ratchet, id: string): Promise<RunView> {
  for (;;) {
    const run = await ratchet.getRun(id);
    if (run && ['succeeded', 'failed', 'cancelled', 'expired'].includes(run.state)) return run;
    await new Promise((r) => setTimeout(r, 100));
  }
}

const services = await startServices();
process.env.RATCHET_EXAMPLE_SERVICES_URL = services.url;
const ratchet = await createRatchet({
  dataDir: ':memory:',
  workflowsDir: fileURLToPath(new URL('../workflows', import.meta.url)),
  logger: silentLogger(),
});
const worker = ratchet.worker();
await worker.start();
try {
  for (const label of ['first run', 'resubmitted run']) {
    const { id } = await ratchet.submit('reconcile-invoice', { invoiceId });
    const run = await finished(ratchet, id);
    console.log(`${label} ${id}: ${run.state}`);
    for (const s of run.stages) console.log(`  ${s.seq} ${s.tool.padEnd(16)} ${s.state.padEnd(9)} attempt ${s.attempt} fence ${s.fence}`);
    console.log('  result:', JSON.stringify(run.result ?? run.error));
  }
  const { cases, requests } = await services.effects();
  console.log(
    `cases filed at the receiver: ${cases.length}; requests: ${requests.map((r) => `${r.status}${r.replayed ? ' (replayed)' : ''}`).join(', ')}`,
  );
} finally {
  await worker.stop();
  await ratchet.close();
  await services.close();
}
