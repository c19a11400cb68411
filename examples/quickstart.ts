/**
 * The lease protocol on the embedded default (PGlite in .ratchet/, no servers): a run of three
 * stages; worker A claims stage 2 and stalls past its lease; worker B reclaims it with a
 * greater fencing token and finishes; A's late result is rejected, never used.
 *   npx tsx examples/quickstart.ts       (RATCHET_DATA_DIR or --data-dir to put the data elsewhere)
 */
import { openStore } from '../src/index.js';

const dataDir = process.argv.find((a) => a.startsWith('--data-dir='))?.slice('--data-dir='.length) ?? process.env.RATCHET_DATA_DIR;
const store = await openStore({ dataDir });
const show = (...parts: unknown[]) => console.log(...parts);

try {
  const stage = (name: string) => ({
    name,
    tool: name,
    toolClass: 'io',
    leaseMs: 3000,
    timeoutMs: 2000,
    maxDurationMs: 60_000,
    maxAttempts: 3,
  });
  const run = await store.createRun({
    workflow: 'quickstart',
    definitionHash: 'demo',
    input: { doc: 42 },
    stages: [stage('fetch'), stage('extract'), stage('file_case')],
  });
  show(`run ${run.id} submitted (${store.kind}${store.dataDir ? ` at ${store.dataDir}` : ''})`);

  let input: unknown = { doc: 42 };
  for (let seq = 1; seq <= 3; seq++) {
    let owner = 'worker-A';
    let [s] = await store.claim({ owner, toolClass: 'io', limit: 1 });
    if (!s) throw new Error('nothing to claim');
    show(`  stage ${s.seq} ${s.tool}: claimed by worker-A, fence ${s.fence}, lease until ${s.leaseUntil.toISOString()}`);
    if (seq === 2) {
      show('  worker-A stalls past its lease (the database clock moves 4 s)...');
      await store.clock.advance(4000);
      const [b] = await store.claim({ owner: 'worker-B', toolClass: 'io', limit: 1 });
      show(`  stage ${b!.seq} reclaimed by worker-B with fence ${b!.fence} (> ${s.fence}), attempt ${b!.attempt}`);
      const [late] = await store.finish('worker-A', [
        { stageId: s.id, fence: s.fence, outcome: 'succeeded', result: { by: 'A' }, next: { seq: 3, input: {} } },
      ]);
      show(
        `  worker-A's late result: ${late!.accepted ? 'ACCEPTED (bug!)' : 'rejected'} (${late!.currentState}, current fence ${late!.currentFence})`,
      );
      s = b!;
      owner = 'worker-B';
    }
    const result = { seq, from: input, by: owner };
    const last = seq === 3;
    const [v] = await store.finish(owner, [
      {
        stageId: s.id,
        fence: s.fence,
        outcome: 'succeeded',
        result,
        ...(last ? { run: { state: 'succeeded' as const, result } } : { next: { seq: seq + 1, input: result } }),
      },
    ]);
    show(`  stage ${s.seq} ${s.tool}: ${v!.accepted ? 'committed' : 'rejected'}`);
    input = result;
  }
  const final = await store.getRun(run.id);
  show(`run ${final!.id}: ${final!.state}`);
  show('events:', (await store.listEvents(run.id)).map((e) => `${e.type}${e.fence ? `#${e.fence}` : ''}`).join(' -> '));
} finally {
  await store.clock.setOffset(0); // the demo's clock move is not left behind
  await store.close();
}
