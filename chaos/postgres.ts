import { execFile } from 'node:child_process';
import { chmodSync, chownSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

/**
 * A private PostgreSQL cluster for the chaos soak, in a temporary directory on its own port
 * (127.0.0.1 only, trust auth), so a restart with `-m immediate` never touches the machine's
 * cluster. As root, initdb and pg_ctl run as the `postgres` user (initdb refuses root).
 */
export interface PrivatePostgres {
  readonly port: number;
  /** postgres://chaos@127.0.0.1:<port>/<db> */
  url(db?: string): string;
  /** `pg_ctl restart -m immediate`: every backend dies at once, no checkpoint (crash recovery on start). */
  restart(): Promise<void>;
  close(): Promise<void>;
}

const BIN = process.env.PG_BIN ?? '/usr/lib/postgresql/15/bin';
const run = promisify(execFile);

async function freePort(): Promise<number> {
  const srv = net.createServer();
  await new Promise<void>((resolve, reject) => {
    srv.once('error', reject);
    srv.listen({ host: '127.0.0.1', port: 0 }, () => resolve());
  });
  const addr = srv.address() as net.AddressInfo;
  await new Promise<void>((resolve) => srv.close(() => resolve()));
  return addr.port;
}

function asOwner(cmd: string, args: string[]): [string, string[]] {
  if (process.getuid?.() !== 0) return [cmd, args];
  return ['runuser', ['-u', 'postgres', '--', cmd, ...args]];
}

export async function startPrivatePostgres(): Promise<PrivatePostgres> {
  const dir = mkdtempSync(join(tmpdir(), 'ratchet-chaos-pg-'));
  const data = join(dir, 'data');
  const log = join(dir, 'pg.log');
  if (process.getuid?.() === 0) {
    const pw = readFileSync('/etc/passwd', 'utf8')
      .split('\n')
      .find((l) => l.startsWith('postgres:'));
    if (!pw) throw new Error('private postgres: running as root and there is no postgres user to run initdb as');
    const [, , uid, gid] = pw.split(':');
    chownSync(dir, Number(uid), Number(gid));
  }
  chmodSync(dir, 0o700);
  const port = await freePort();
  const exec = async (cmd: string, args: string[]) => {
    const [c, a] = asOwner(join(BIN, cmd), args);
    try {
      return await run(c, a, { maxBuffer: 8 * 1024 * 1024 });
    } catch (err) {
      let tail = '';
      try {
        tail = readFileSync(log, 'utf8').slice(-3000);
      } catch {
        /* no log yet */
      }
      throw new Error(`private postgres: ${cmd} failed: ${(err as Error).message}\n${tail}`);
    }
  };
  await exec('initdb', ['-D', data, '-U', 'chaos', '--auth=trust', '--no-sync', '-E', 'UTF8', '--locale=C']);
  writeFileSync(
    join(data, 'postgresql.auto.conf'),
    [
      `port = ${port}`,
      `listen_addresses = '127.0.0.1'`,
      `unix_socket_directories = '${dir}'`,
      // fsync off only risks an operating-system crash; a commit must still survive `-m immediate`, so
      // synchronous_commit stays on (off would drop the last commits from shared WAL buffers at the restart).
      'fsync = off',
      'synchronous_commit = on',
      'max_connections = 200',
      'shared_buffers = 128MB',
      '',
    ].join('\n'),
  );
  const start = () => exec('pg_ctl', ['-D', data, '-l', log, '-w', '-t', '60', '-o', `-p ${port}`, 'start']);
  await start();
  const url = (db = 'postgres') => `postgres://chaos@127.0.0.1:${port}/${db}`;
  let closed = false;
  const onExit = () => {
    try {
      process.kill(Number(readFileSync(join(data, 'postmaster.pid'), 'utf8').split('\n')[0]), 'SIGQUIT');
    } catch {
      /* gone */
    }
    // The directory too (the server may still be writing to it: removing it is best effort).
    try {
      rmSync(dir, { recursive: true, force: true });
    } catch {
      /* best effort */
    }
  };
  process.on('exit', onExit);
  return {
    port,
    url,
    async restart() {
      await exec('pg_ctl', ['-D', data, '-l', log, '-w', '-t', '60', '-m', 'immediate', '-o', `-p ${port}`, 'restart']);
    },
    async close() {
      if (closed) return;
      closed = true;
      await exec('pg_ctl', ['-D', data, '-w', '-t', '30', '-m', 'immediate', 'stop']).catch(() => {});
      process.off('exit', onExit);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
