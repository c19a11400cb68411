/**
 * The soak's HTTP task API: `createServer` over a Ratchet that submits and reads only (no
 * worker), with every workflow version of chaos/workflows/v2 loaded. Prints {"url":...} once
 * listening; SIGTERM closes it.
 *   node --import tsx chaos/api-process.ts
 */
import pino from 'pino';
import { createServer } from '../src/api/index.js';
import { createRatchet } from '../src/engine.js';

const logger = pino({ level: process.env.RATCHET_LOG_LEVEL ?? 'warn', base: { role: 'api' } }, pino.destination(2));
const ratchet = await createRatchet({
  databaseUrl: process.env.DATABASE_URL!,
  workflowsDir: process.env.WORKFLOWS_DIR!,
  logger,
  poolSize: 8,
  queryTimeoutMs: 5000,
});
const server = await createServer({ ratchet, tokens: [process.env.API_TOKEN!], port: 0, logger });
process.stdout.write(`${JSON.stringify({ url: server.url })}\n`);
process.on('SIGTERM', () => {
  void server
    .close()
    .then(() => ratchet.close())
    .then(
      () => process.exit(0),
      () => process.exit(1),
    );
});
