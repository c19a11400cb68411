import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));

export interface Child {
  proc: ChildProcess;
  /** Resolves with the first JSON line the child prints that matches `pred`. */
  line(pred?: (o: Record<string, unknown>) => boolean, timeoutMs?: number): Promise<Record<string, unknown>>;
  exit: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  stderr(): string;
}

/** Runs a TypeScript file under tsx as a real child process (for kill / pause / race tests). */
export function spawnTs(file: string, args: string[], env: NodeJS.ProcessEnv = {}): Child {
  const proc = spawn(process.execPath, ['--import', 'tsx', file, ...args], {
    cwd: ROOT,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const lines: Record<string, unknown>[] = [];
  const waiters: { pred: (o: Record<string, unknown>) => boolean; resolve: (o: Record<string, unknown>) => void }[] = [];
  let buf = '';
  let err = '';
  proc.stdout!.on('data', (d: Buffer) => {
    buf += d.toString();
    let i;
    while ((i = buf.indexOf('\n')) >= 0) {
      const text = buf.slice(0, i);
      buf = buf.slice(i + 1);
      let o: Record<string, unknown>;
      try {
        o = JSON.parse(text) as Record<string, unknown>;
      } catch {
        continue;
      }
      lines.push(o);
      for (const w of [...waiters])
        if (w.pred(o)) {
          waiters.splice(waiters.indexOf(w), 1);
          w.resolve(o);
        }
    }
  });
  proc.stderr!.on('data', (d: Buffer) => {
    err += d.toString();
  });
  const exit = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    proc.on('exit', (code, signal) => resolve({ code, signal })),
  );
  return {
    proc,
    exit,
    stderr: () => err,
    line(pred = () => true, timeoutMs = 30_000) {
      const seen = lines.find(pred);
      if (seen) return Promise.resolve(seen);
      return new Promise((resolve, reject) => {
        const t = setTimeout(
          () => reject(new Error(`child printed no matching line in ${timeoutMs} ms; stderr: ${err.slice(-2000)}`)),
          timeoutMs,
        );
        waiters.push({
          pred,
          resolve: (o) => {
            clearTimeout(t);
            resolve(o);
          },
        });
        void exit.then(() => setTimeout(() => reject(new Error(`child exited without a matching line; stderr: ${err.slice(-2000)}`)), 50));
      });
    },
  };
}
