import net from 'node:net';

/**
 * A small fault-injecting TCP proxy on 127.0.0.1, placed between a client (often a child
 * process) and PostgreSQL, a receiver, or any TCP server. It runs in the test process: keep
 * that process's event loop free (no execSync / spawnSync / busy loops while a child talks
 * through the proxy), or the child's bytes will not move.
 *
 * Modes, switchable at any time with `setMode`:
 *
 * - `pass`: bytes flow both ways (with backpressure); FIN, close and RST are relayed.
 * - `blackhole`: a network partition. Every connection open at the switch, and every connection
 *   accepted while in this mode, is marked black-holed: bytes from either side are read and
 *   discarded (nothing buffered, nothing delivered) and FIN / close / RST are not relayed either,
 *   so neither end learns anything. New connections are accepted, but no upstream connection
 *   is made for them.
 *   Black-holing is permanent for a connection: after `setMode('pass')` the connections that
 *   were black-holed keep dropping everything, as if the partition had outlasted the TCP
 *   timeouts; only connections made after the return to `pass` work. Their peers are told
 *   nothing until `setMode('reset')` (which resets them, e.g. to free a PostgreSQL backend the
 *   partition left behind) or `close()`.
 *   Note: on loopback the proxy's kernel still ACKs what it discards, so a client's writes
 *   succeed and TCP keepalive cannot notice the partition; only application timeouts
 *   (`query_timeout`, `connectionTimeoutMillis`, lease expiry...) will.
 * - `reset`: every current connection (both halves, black-holed ones included) is closed with an
 *   RST (`socket.resetAndDestroy()`), and every new connection is accepted and reset at once
 *   (clients see ECONNRESET / "Connection terminated unexpectedly", fast). The listener stays
 *   open, so the port cannot be taken by someone else meanwhile.
 * - `hold`: a late request. Bytes from the client to the target (of open connections and new
 *   ones) are kept in the proxy, in order, instead of being sent; bytes from the target to the
 *   client still flow. `held()` shows what is kept; the next `setMode('pass')` sends it all
 *   (then a client FIN that came meanwhile), as if the network had delayed it; `blackhole` or
 *   `reset` drop it.
 */
export type ProxyMode = 'pass' | 'blackhole' | 'reset' | 'hold';

export interface TcpProxyOptions {
  target: { host: string; port: number };
  /** Port to listen on (127.0.0.1); 0 (default) picks a free one. */
  listenPort?: number;
  /** Initial mode (default `pass`). */
  mode?: ProxyMode;
}

export interface TcpProxyStats {
  /** Client connections accepted since start. */
  accepted: number;
  /** Bytes relayed (both directions). */
  forwardedBytes: number;
  /** Bytes read and discarded by black-holed connections (both directions). */
  droppedBytes: number;
  /** Client bytes kept by `hold` (released or dropped since included). */
  heldBytes: number;
}

export interface TcpProxy {
  readonly port: number;
  /** The URL with its host:port replaced by 127.0.0.1:<proxy port> (postgres://, redis://, http://...). */
  url(base: string): string;
  setMode(mode: ProxyMode): void;
  readonly mode: ProxyMode;
  /** Connections with at least one open half (client side or upstream side). */
  connections(): number;
  /** The client bytes `hold` keeps now, per connection (in arrival order), not sent yet. */
  held(): Buffer[];
  stats(): TcpProxyStats;
  /** Stops listening and destroys every connection. Idempotent. */
  close(): Promise<void>;
}

interface Pair {
  client: net.Socket;
  upstream: net.Socket | null;
  blackholed: boolean;
  /** Client bytes kept by `hold`, and whether the client's FIN came meanwhile. */
  held: Buffer[];
  heldEnd: boolean;
}

function isOpen(s: net.Socket | null): s is net.Socket {
  return s !== null && !s.destroyed;
}

/** Closes a socket with an RST (plain destroy if it has no connected TCP handle yet). */
function reset(s: net.Socket | null): void {
  if (!isOpen(s)) return;
  if (s.connecting) s.destroy();
  else s.resetAndDestroy();
}

export async function startTcpProxy(opts: TcpProxyOptions): Promise<TcpProxy> {
  const { target } = opts;
  let mode: ProxyMode = opts.mode ?? 'pass';
  let closed = false;
  const pairs = new Set<Pair>();
  const stats: TcpProxyStats = { accepted: 0, forwardedBytes: 0, droppedBytes: 0, heldBytes: 0 };

  const forget = (p: Pair) => {
    if (!isOpen(p.client) && !isOpen(p.upstream)) pairs.delete(p);
  };

  /** Relays `from` → `to` while the pair is not black-holed (client bytes kept while `hold`). */
  const wire = (p: Pair, from: net.Socket, to: () => net.Socket | null) => {
    const fromClient = from === p.client;
    from.on('data', (chunk: Buffer) => {
      const dest = to();
      if (fromClient && mode === 'hold' && !p.blackholed) {
        stats.heldBytes += chunk.length;
        p.held.push(chunk);
        return;
      }
      if (p.blackholed || !isOpen(dest)) {
        stats.droppedBytes += chunk.length;
        return;
      }
      stats.forwardedBytes += chunk.length;
      if (!dest.write(chunk)) {
        from.pause();
        dest.once('drain', () => from.resume());
      }
    });
    from.on('end', () => {
      const dest = to();
      if (fromClient && p.held.length > 0) {
        p.heldEnd = true;
        return;
      }
      if (!p.blackholed && isOpen(dest)) dest.end();
    });
    from.on('error', () => {
      // A reset, or the upstream refusing / failing: the other side learns it with an RST.
      if (!p.blackholed) reset(to());
    });
    from.on('close', () => {
      const dest = to();
      if (fromClient && p.held.length > 0) return; // sent (then ended) when the hold is released
      if (!p.blackholed && isOpen(dest)) dest.destroy();
      forget(p);
    });
  };

  const server = net.createServer({ allowHalfOpen: true, noDelay: true }, (client) => {
    stats.accepted++;
    client.on('error', () => {}); // always listened; the relay handler below does the work
    if (closed || mode === 'reset') {
      reset(client);
      return;
    }
    const p: Pair = { client, upstream: null, blackholed: mode === 'blackhole', held: [], heldEnd: false };
    pairs.add(p);
    if (p.blackholed) {
      // Partitioned from the start: accept, read and drop, never dial the target.
      client.on('data', (chunk: Buffer) => {
        stats.droppedBytes += chunk.length;
      });
      client.on('close', () => forget(p));
      return;
    }
    const upstream = net.connect({ host: target.host, port: target.port, allowHalfOpen: true, noDelay: true });
    upstream.on('error', () => {});
    p.upstream = upstream;
    wire(p, client, () => p.upstream);
    wire(p, upstream, () => p.client);
  });
  server.on('error', () => {});

  await new Promise<void>((resolve, reject) => {
    const onError = (err: Error) => reject(err);
    server.once('error', onError);
    server.listen({ host: '127.0.0.1', port: opts.listenPort ?? 0 }, () => {
      server.off('error', onError);
      resolve();
    });
  });
  const address = server.address();
  if (address === null || typeof address === 'string') throw new Error('tcp proxy: no TCP address');
  const port = address.port;

  return {
    port,
    get mode() {
      return mode;
    },
    url(base: string): string {
      const u = new URL(base);
      u.hostname = '127.0.0.1';
      u.port = String(port);
      return u.toString();
    },
    setMode(next: ProxyMode): void {
      if (closed) throw new Error('tcp proxy: closed');
      const wasHold = mode === 'hold';
      mode = next;
      if (next !== 'hold' && wasHold) {
        for (const p of pairs) {
          const kept = p.held;
          p.held = [];
          if (next !== 'pass' || p.blackholed || !isOpen(p.upstream)) continue;
          for (const chunk of kept) {
            stats.forwardedBytes += chunk.length;
            p.upstream.write(chunk);
          }
          if (p.heldEnd) p.upstream.end();
        }
      }
      if (next === 'blackhole') {
        for (const p of pairs) {
          p.blackholed = true;
          // Keep reading (and dropping) even if a relay had paused for backpressure.
          p.client.resume();
          p.upstream?.resume();
        }
      } else if (next === 'reset') {
        for (const p of [...pairs]) {
          p.blackholed = true; // relay nothing more, not even the close of the other half
          reset(p.client);
          reset(p.upstream);
          pairs.delete(p);
        }
      }
    },
    held(): Buffer[] {
      return [...pairs].filter((p) => p.held.length > 0).map((p) => Buffer.concat(p.held));
    },
    connections(): number {
      let n = 0;
      for (const p of pairs) if (isOpen(p.client) || isOpen(p.upstream)) n++;
      return n;
    },
    stats(): TcpProxyStats {
      return { ...stats };
    },
    async close(): Promise<void> {
      if (closed) return;
      closed = true;
      const done = new Promise<void>((resolve) => server.close(() => resolve()));
      for (const p of pairs) {
        p.blackholed = true;
        p.client.destroy();
        p.upstream?.destroy();
      }
      pairs.clear();
      await done;
    },
  };
}

/** `proxy.url(url)`: the URL (postgres://, redis://, http://...) pointed at the proxy. */
export function pgUrlVia(proxy: Pick<TcpProxy, 'url'>, url: string): string {
  return proxy.url(url);
}
