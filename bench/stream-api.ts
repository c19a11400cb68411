/**
 * The task API of bench/stream.ts's split topology, in a process of its own, like `ratchet serve`
 * beside `ratchet worker`: `stream-api.ts <database url> <token>` opens an engine on the bench's
 * database without starting a worker (createRatchet runs no stage until `worker().start()`), serves
 * the task API on 127.0.0.1, port 0, and prints `listening <url>`. The watchers' streams come here;
 * the runs' stages run in the bench's process, and the events reach this process by LISTEN/NOTIFY.
 * stdin: `stats` prints `stats <stream reads> <stream end checks>` (the stream's statements this
 * process has sent so far, counted where the route sends them: the store's queryable); stdin's end
 * closes the server and the engine.
 */
import { createInterface } from 'node:readline';
import { createServer } from '../src/api/server.js';
import { createRatchet } from '../src/engine.js';
import { silentLogger } from '../src/logger.js';

const [databaseUrl, token] = process.argv.slice(2);
if (!databaseUrl || !token) throw new Error('usage: stream-api.ts <database url> <token>');
const ratchet = await createRatchet({ databaseUrl, workflows: [], logger: silentLogger(), poolSize: 12 });
const statements = new Map<string, number>();
const db = ratchet.store.db as { query: (...a: unknown[]) => Promise<unknown[]> };
const query = db.query.bind(db);
db.query = (...a: unknown[]) => {
  const name = a[2];
  if (typeof name === 'string' && name.startsWith('ratchet_stream')) statements.set(name, (statements.get(name) ?? 0) + 1);
  return query(...a);
};
const server = await createServer({ ratchet, tokens: [token], port: 0 });
process.stdout.write(`listening ${server.url}\n`);
for await (const line of createInterface({ input: process.stdin })) {
  if (line.trim() === 'stats')
    process.stdout.write(`stats ${statements.get('ratchet_stream_events') ?? 0} ${statements.get('ratchet_stream_end_check') ?? 0}\n`);
}
await server.close();
await ratchet.close();
