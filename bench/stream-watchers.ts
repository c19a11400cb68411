/**
 * The watchers of bench/stream.ts, in a process of their own (their CPU is not the engine's; the
 * bench starts it under `nice`, see there): reads `watch <url> <token> <runId> <n>` lines on stdin,
 * opens n server-sent event streams of the run, prints `open <runId>` once every stream has its
 * first event and, when every stream has ended (after the run's terminal event),
 * `done <runId> <fewest events> <most events> <same> <ids>`: same is 1 when every stream got the
 * same event ids in the same order, none twice; ids is the first stream's ids, comma-separated
 * (the bench compares them with the run's events in stream order).
 */
import { createInterface } from 'node:readline';
import { createSseParser } from '../src/client/sse.js';

async function watchOne(url: string, token: string, runId: string, onFirst: () => void): Promise<string[]> {
  const res = await fetch(`${url}/v1/runs/${runId}/stream`, { headers: { authorization: `Bearer ${token}` } });
  if (!res.ok) throw new Error(`stream answered ${res.status}`);
  const parser = createSseParser();
  const decoder = new TextDecoder();
  const ids: string[] = [];
  for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
    for (const m of parser.push(decoder.decode(chunk, { stream: true }))) {
      if (m.event !== 'message') continue;
      if (ids.push(m.id ?? '') === 1) onFirst();
    }
  }
  return ids;
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
    (streams) => {
      const lengths = streams.map((s) => s.length);
      const one = streams[0]!.join(',');
      const same = new Set(streams[0]).size === streams[0]!.length && streams.every((s) => s.join(',') === one);
      process.stdout.write(`done ${runId} ${Math.min(...lengths)} ${Math.max(...lengths)} ${same ? 1 : 0} ${one}\n`);
    },
    (err: unknown) => process.stdout.write(`error ${runId} ${(err as Error).message}\n`),
  );
}
