/**
 * Runs the example services on their own (for workers in other processes):
 *   npx tsx examples/serve-services.ts            # http://127.0.0.1:4100, in-memory PGlite
 *   PORT=4200 SERVICES_DATABASE_URL=postgres://... npx tsx examples/serve-services.ts
 * Point the tools at them with RATCHET_EXAMPLE_SERVICES_URL (default http://127.0.0.1:4100).
 */
import { startServices } from './services.js';

const services = await startServices({ port: Number(process.env.PORT ?? 4100) });
console.log(`example services on ${services.url} (${services.storage}); Ctrl-C to stop`);
const stop = () => void services.close().then(() => process.exit(0));
process.once('SIGINT', stop);
process.once('SIGTERM', stop);
