import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

/** `ratchet worker` refuses a bad --metrics-port before it opens anything (exit 2, invalid_input naming the option). */
const ROOT = fileURLToPath(new URL('../..', import.meta.url));

function ratchet(args: string[]): Promise<{ code: number | null; stderr: string }> {
  return new Promise((resolve) => {
    const env = { ...process.env, DATABASE_URL: 'postgres://root@127.0.0.1:1/never-opened', REDIS_URL: '' };
    const child = spawn(process.execPath, ['bin/ratchet.mjs', ...args], { cwd: ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => {
      stderr += d.toString();
    });
    child.on('exit', (code) => resolve({ code, stderr }));
  });
}

describe('ratchet worker --metrics-port', () => {
  for (const port of ['70000', '-1', 'abc']) {
    it(`refuses --metrics-port ${port}`, async () => {
      const { code, stderr } = await ratchet(['worker', '--json', '--metrics-port', port]);
      expect(code).toBe(2);
      const line = stderr
        .trim()
        .split('\n')
        .filter((l) => l.startsWith('{"error"'))
        .at(-1)!;
      expect(JSON.parse(line).error).toMatchObject({ code: 'invalid_input', path: 'metrics-port' });
    }, 30_000);
  }
});
