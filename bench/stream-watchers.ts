/**
 * The watchers of bench/stream.ts, in a process of their own (their CPU is not the engine's):
 * reads `watch <url> <token> <runId> <n>` lines on stdin, opens n server-sent event streams of
 * the run, prints `open <runId>` once every stream has its first event and `done <runId>
 * <fewest events> <most events>` when every stream has ended (after the run's terminal event).
 */
import { createInterface } from 'node:readline';
import { createSseParser } from '../src/client/sse.js';

async function watchOne(url: string, token: string, runId: string, onFirst: () => void): Promise<number> {
  const res = await fetch(`${url}/v1/runs/${runId}/stream`, { headers: { authorization: `Bearer ${token}` } });
  if (!res.ok) throw new Error(`stream answered ${res.status}`);
  const parser = createSseParser();
  const decoder = new TextDecoder();
  let events = 0;
  for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
    for (const _m of parser.push(decoder.decode(chunk, { stream: true }))) if (events++ === 0) onFirst();
  }
  return events;
}

for await (const line of createInterface({ input: process.stdin })) {
  const [cmd, url, token, runId, n] = line.trim().split(' ');
  if (cmd !== 'watch' || !url || !token || !runId || !n) continue;
  let first = 0;
  const count = Number(n);
  void Promise.all(
    Array.from({ length: count }, () =>
      watchOne(url, token, runId, () => {
        if (++first === count) process.stdout.write(`open ${runId}\n`);
      }),
    ),
  ).then(
    (counts) => process.stdout.write(`done ${runId} ${Math.min(...counts)} ${Math.max(...counts)}\n`),
    (err: unknown) => process.stdout.write(`error ${runId} ${(err as Error).message}\n`),
  );
}
