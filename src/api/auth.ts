import { createHash, timingSafeEqual } from 'node:crypto';
import { isIP } from 'node:net';

/**
 * Bearer tokens from configuration. Each token and each presented value is hashed (SHA-256)
 * first, so the comparison is over equal lengths, and every configured token is compared
 * (no early exit): the time taken says nothing about how close a guess was.
 */
export function createTokenCheck(tokens: readonly string[]): (authorization: string | undefined) => boolean {
  const digests = tokens.map((t) => createHash('sha256').update(t, 'utf8').digest());
  return (authorization) => {
    const m = /^Bearer[ ]+(\S.*)$/i.exec(authorization ?? '');
    const presented = createHash('sha256')
      .update(m?.[1]?.trim() ?? '', 'utf8')
      .digest();
    let ok = false;
    for (const d of digests) ok = timingSafeEqual(d, presented) || ok;
    return ok && m !== null;
  };
}

/** 127.0.0.0/8, ::1, localhost: reachable from this machine only. */
export function isLoopback(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, '').toLowerCase();
  if (h === 'localhost') return true;
  if (isIP(h) === 4) return h.startsWith('127.');
  if (isIP(h) === 6) return h === '::1' || h === '0:0:0:0:0:0:0:1' || /^::ffff:127\./.test(h);
  return false;
}

/**
 * Who a request comes from, for the events of a decision (issue 10): `token:` and the first 12
 * hex digits of the presented token's SHA-256 — enough to tell configured tokens apart, nothing
 * that reveals one. `anonymous` when the server runs without tokens (loopback only).
 */
export function tokenIdentity(authorization: string | undefined, tokens: readonly string[]): string {
  if (tokens.length === 0) return 'anonymous';
  const m = /^Bearer[ ]+(\S.*)$/i.exec(authorization ?? '');
  const token = m?.[1]?.trim() ?? '';
  return `token:${createHash('sha256').update(token, 'utf8').digest('hex').slice(0, 12)}`;
}

/**
 * Is `host` (a Host header) a loopback name (isLoopback: localhost, 127.0.0.0/8, [::1]), with any port?
 * With no tokens configured everyone who reaches the server is trusted, so a page elsewhere
 * must not reach it through a DNS name rebound to 127.0.0.1 (DNS rebinding): its requests
 * carry that name as Host, and they are refused.
 */
export function isLoopbackHost(host: string | undefined): boolean {
  // The Host header's name without its port (a bracketed IPv6 literal keeps its brackets), judged by isLoopback.
  const m = /^(\[[^\]]+\]|[^:]+)(?::\d{1,5})?$/.exec(host?.trim() ?? '');
  return m !== null && isLoopback(m[1]!);
}
