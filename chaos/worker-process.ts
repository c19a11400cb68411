/**
 * A soak worker process: serves every class of WORKFLOWS_DIR (chaos/workflows/v1 or v2)
 * against DATABASE_URL (its own link proxy) with REDIS_URL for wake-ups. Prints
 * {"ready":true,"owner":...} once serving. SIGTERM drains and stops it; SIGUSR2 blocks its
 * event loop for BLOCK_MS (a synchronous busy loop: no timer, heartbeat or socket runs meanwhile).
 *   node --import tsx chaos/worker-process.ts <name>
 */
import pino from 'pino';
import { createRatchet } from '../src/engine.js';

const name = process.argv[2] ?? 'worker';
const logger = pino({ level: process.env.RATCHET_LOG_LEVEL ?? 'warn', base: { worker: name } }, pino.destination(2));
const ratchet = await createRatchet({
  databaseUrl: process.env.DATABASE_URL!,
  redisUrl: process.env.REDIS_URL,
  workflowsDir: process.env.WORKFLOWS_DIR!,
  logger,
  poolSize: 6,
  queryTimeoutMs: Number(process.env.QUERY_TIMEOUT_MS ?? 2000),
});
const worker = ratchet.worker({
  name,
  concurrency: Number(process.env.CONCURRENCY ?? 4),
  pollIntervalMs: 200,
  graceMs: Number(process.env.GRACE_MS ?? 3000),
});
await worker.start();

let blocks = 0;
process.on('SIGUSR2', () => {
  const until = Date.now() + Number(process.env.BLOCK_MS ?? 4500);
  // Written before the loop (stdout pipes are synchronous on Linux): the harness waits for it before it counts the block.
  process.stdout.write(`${JSON.stringify({ blocking: true, n: ++blocks })}\n`);
  while (Date.now() < until) {
    /* the event loop is blocked on purpose */
  }
});
process.on('SIGTERM', () => {
  void worker
    .stop()
    .then(() => ratchet.close())
    .then(
      () => process.exit(0),
      () => process.exit(1),
    );
});
// Ready only once its signal handlers are in place: a SIGUSR2 sent on the ready line before its handler
// existed took the default action and killed the worker (2 loop_block injections failed in a 30-minute soak).
process.stdout.write(`${JSON.stringify({ ready: true, owner: worker.owner })}\n`);
