import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/**
 * A private `redis-server` (from PATH) for tests that flush, stop or restart Redis: never the
 * shared server other test files use. Bound to 127.0.0.1 on a random free port, no persistence
 * (`--save "" --appendonly no`), working directory and log in a temporary directory.
 */
export interface PrivateRedis {
  readonly port: number;
  /** redis://127.0.0.1:<port> */
  readonly url: string;
  /** Stops the server (SIGTERM by default; SIGKILL for a crash) and waits for it to exit. */
  stop(signal?: NodeJS.Signals): Promise<void>;
  /** (Re)starts the server on the same port and waits until it answers PING. No-op if running. */
  start(): Promise<void>;
  /** FLUSHALL. */
  flushAll(): Promise<void>;
  /** Whether the server process is running. */
  running(): boolean;
  /** Stops the server and removes its temporary directory. Idempotent. */
  close(): Promise<void>;
}

const READY_TIMEOUT_MS = 10_000;
const STOP_TIMEOUT_MS = 5_000;

/** A port that was free a moment ago on 127.0.0.1 (redis-server then binds it; retried on a race). */
async function freePort(): Promise<number> {
  const srv = net.createServer();
  await new Promise<void>((resolve, reject) => {
    srv.once('error', reject);
    srv.listen({ host: '127.0.0.1', port: 0 }, () => resolve());
  });
  const addr = srv.address();
  await new Promise<void>((resolve) => srv.close(() => resolve()));
  if (addr === null || typeof addr === 'string') throw new Error('no TCP address');
  return addr.port;
}

/** Sends one inline command and resolves with the first reply line (e.g. `+PONG`). */
export function redisInline(port: number, command: string, timeoutMs = 1_000): Promise<string> {
  return new Promise((resolve, reject) => {
    const sock = net.connect({ host: '127.0.0.1', port });
    let buf = '';
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new Error(`redis on port ${port}: no reply to ${command} in ${timeoutMs} ms`));
    }, timeoutMs);
    sock.on('connect', () => sock.write(`${command}\r\n`));
    sock.on('data', (d: Buffer) => {
      buf += d.toString();
      const i = buf.indexOf('\r\n');
      if (i < 0) return;
      clearTimeout(timer);
      sock.destroy();
      resolve(buf.slice(0, i));
    });
    sock.on('error', (err) => {
      clearTimeout(timer);
      sock.destroy();
      reject(err);
    });
  });
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

export async function startPrivateRedis(): Promise<PrivateRedis> {
  const dir = mkdtempSync(join(tmpdir(), 'ratchet-redis-'));
  const logFile = join(dir, 'redis.log');
  let proc: ChildProcess | null = null;
  let exited: Promise<void> = Promise.resolve();
  let closed = false;
  let port = 0;

  // If the test process dies without close(), do not leave a redis-server behind.
  const onExit = () => {
    proc?.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true }); // its directory too (log, no data: --save '')
  };
  process.on('exit', onExit);

  const log = () => {
    try {
      return readFileSync(logFile, 'utf8').slice(-2000);
    } catch {
      return '(no log)';
    }
  };

  /** Spawns redis-server on `port`; resolves once it answers PING, rejects if it exits first. */
  const launch = async (): Promise<void> => {
    const child = spawn(
      'redis-server',
      [
        '--port',
        String(port),
        '--bind',
        '127.0.0.1',
        '--save',
        '',
        '--appendonly',
        'no',
        '--dir',
        dir,
        '--logfile',
        logFile,
        '--daemonize',
        'no',
      ],
      { stdio: 'ignore' },
    );
    proc = child;
    const state: { gone: boolean; spawnError: Error | null } = { gone: false, spawnError: null };
    exited = new Promise<void>((resolve) => {
      const done = () => {
        state.gone = true;
        if (proc === child) proc = null;
        resolve();
      };
      child.once('error', (err) => {
        state.spawnError = err;
        done();
      });
      child.once('exit', done);
    });
    const deadline = Date.now() + READY_TIMEOUT_MS;
    while (Date.now() < deadline) {
      if (state.gone) break;
      try {
        if ((await redisInline(port, 'PING', 500)) === '+PONG') return;
      } catch {
        // not listening yet
      }
      await sleep(50);
    }
    if (!state.gone) child.kill('SIGKILL');
    await exited;
    const why = state.spawnError ? `could not spawn redis-server: ${state.spawnError.message}` : `did not answer PING on port ${port}`;
    throw new Error(`private redis: ${why}; log: ${log()}`);
  };

  const stop = async (signal: NodeJS.Signals = 'SIGTERM'): Promise<void> => {
    const child = proc;
    if (!child) return;
    child.kill(signal);
    const timer = setTimeout(() => child.kill('SIGKILL'), STOP_TIMEOUT_MS);
    await exited;
    clearTimeout(timer);
  };

  // First start: a fresh random port; retry if another process took it in between.
  let lastError: unknown;
  for (let attempt = 0; attempt < 5; attempt++) {
    port = await freePort();
    try {
      await launch();
      lastError = undefined;
      break;
    } catch (err) {
      lastError = err;
    }
  }
  if (lastError !== undefined) {
    process.off('exit', onExit);
    rmSync(dir, { recursive: true, force: true });
    throw lastError;
  }

  return {
    port,
    url: `redis://127.0.0.1:${port}`,
    stop,
    async start() {
      if (closed) throw new Error('private redis: closed');
      if (proc) return;
      await launch();
    },
    async flushAll() {
      const reply = await redisInline(port, 'FLUSHALL');
      if (reply !== '+OK') throw new Error(`private redis: FLUSHALL answered ${reply}`);
    },
    running: () => proc !== null,
    async close() {
      if (closed) return;
      closed = true;
      await stop();
      process.off('exit', onExit);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
