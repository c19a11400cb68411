import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import type { Context } from 'hono';
import { getCookie } from 'hono/cookie';
import { createTokenCheck, tokenIdentity } from '../api/auth.js';

/** The cookie that keeps the API token the operator entered once (HttpOnly, SameSite=Strict). */
export const SESSION_COOKIE = 'ratchet_token';
/** Twelve hours, then the token is asked for again. */
export const SESSION_MAX_AGE_S = 12 * 3600;

export interface DashboardSession {
  /** Is the request signed in (a token cookie the API accepts, or no tokens configured: loopback only)? */
  signedIn(c: Context): boolean;
  /** Does `token` pass as a bearer token? */
  accepts(token: string): boolean;
  /** The CSRF token for this request's session (empty when not signed in). */
  csrf(c: Context): string;
  /** Who decides through this session (an approval): the token's identity as the API gives it, never the token. */
  identity(c: Context): string;
  /** Is a state-changing request genuine: its CSRF token matches the session's, and it does not come from elsewhere (fromElsewhere)? */
  checkCsrf(c: Context, sent: string | undefined): boolean;
}

/**
 * Did a browser send this request from another site? Its Origin is not this server's (a
 * cross-site form posted under `Referrer-Policy: no-referrer` sends `Origin: null`), or its
 * Sec-Fetch-Site says cross-site / same-site (a sibling subdomain). Neither header (curl, a
 * script): not a browser's cross-site request, so not refused here.
 */
export function fromElsewhere(c: Context): boolean {
  const origin = c.req.header('origin');
  if (origin && origin !== new URL(c.req.url).origin) return true;
  const site = c.req.header('sec-fetch-site');
  return site !== undefined && site !== 'same-origin' && site !== 'none';
}

/**
 * Same auth as the API: the token, entered once on the sign-in page, kept in an HttpOnly
 * cookie (scripts cannot read it; SameSite=Strict keeps other sites from sending it). Buttons
 * carry a CSRF token derived from the session (HMAC of the token), checked on every POST with
 * the Origin header, so a page elsewhere cannot press them.
 */
export function createDashboardSession(tokens: readonly string[]): DashboardSession {
  const check = createTokenCheck(tokens);
  const open = tokens.length === 0;
  // With no tokens (loopback only) the CSRF key is this process's own secret.
  const processKey = randomBytes(32);
  const tokenOf = (c: Context) => getCookie(c, SESSION_COOKIE);
  const signedIn = (c: Context) => open || (tokenOf(c) !== undefined && check(`Bearer ${tokenOf(c)}`));
  const csrf = (c: Context) => {
    if (!signedIn(c)) return '';
    return createHmac('sha256', open ? processKey : Buffer.from(tokenOf(c)!, 'utf8'))
      .update('ratchet-dashboard-csrf')
      .digest('base64url');
  };
  return {
    signedIn,
    accepts: (token) => check(`Bearer ${token}`),
    csrf,
    identity: (c) => tokenIdentity(`Bearer ${tokenOf(c) ?? ''}`, tokens),
    checkCsrf(c, sent) {
      if (fromElsewhere(c)) return false;
      const want = csrf(c);
      if (!want || !sent) return false;
      const a = Buffer.from(want);
      const b = Buffer.from(sent);
      return a.length === b.length && timingSafeEqual(a, b);
    },
  };
}
