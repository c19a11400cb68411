import type { OpenAPIHono } from '@hono/zod-openapi';
import type { Context, MiddlewareHandler } from 'hono';
import { deleteCookie, setCookie } from 'hono/cookie';
import type { Logger } from 'pino';
import type { RunService } from '../api/service.js';
import { workflowFilterSchema } from '../api/schemas.js';
import { streamHandler } from '../api/stream-route.js';
import type { Ratchet } from '../engine.js';
import { InvalidInputError, UnknownRunError } from '../errors.js';
import type { EventHub } from '../live/hub.js';
import { RUN_STATES, type RunState } from '../planner/states.js';
import { DASHBOARD_CSS, DASHBOARD_JS } from './assets.js';
import { html, layout } from './html.js';
import { AWAITING_APPROVAL, EVENTS_SHOWN, listPage, loginPage, runPage, runPanel } from './pages.js';
import { createWaitService } from '../api/wait-service.js';
import { decisionReasonSchema } from '../api/wait-schemas.js';
import { parseInput } from '../store/validate.js';
import { pendingApprovalsPage, waitsOf } from '../store/approvals.js';
import { countStreamBefore, readStreamTail } from '../store/stream.js';
import { runUsage } from '../store/usage.js';
import { createDashboardSession, fromElsewhere, SESSION_COOKIE, SESSION_MAX_AGE_S } from './session.js';

export interface DashboardOptions {
  ratchet: Ratchet;
  service: RunService;
  hub: EventHub;
  tokens: readonly string[];
  heartbeatMs?: number;
  logger: Logger;
  /** The API's body limit (app.ts, AppOptions.bodyLimit), first on every POST: 413 past it, the body read no further. */
  limitBody: MiddlewareHandler;
}

/** Runs per page of the list: a thousand runs are twenty pages, each one indexed read. */
export const DASHBOARD_PAGE_SIZE = 50;
/** Stages awaiting approval on the runs list (the rest one click away), and on the awaiting-approval filter. */
const APPROVALS_ON_LIST = 10;
const APPROVALS_LISTED = 200;

/** Inline style attributes carry the timeline's positions (numbers the server computed); scripts stay 'self' only. */
const SECURITY_HEADERS: Record<string, string> = {
  'Content-Security-Policy':
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
  'X-Content-Type-Options': 'nosniff',
  'Referrer-Policy': 'same-origin',
  'Cache-Control': 'no-store',
};

/**
 * The dashboard at `/` (DESIGN.md "Observability"): server-rendered pages with one small script,
 * same auth as the API (the token entered once, kept in an HttpOnly cookie; CSRF token and
 * Origin checked on every button), live updates from the run's stream. Never shows inputs,
 * results or model answers: sizes and hashes only.
 */
export function registerDashboard(app: OpenAPIHono, opts: DashboardOptions): void {
  const session = createDashboardSession(opts.tokens);
  const waits = createWaitService(opts.ratchet);
  const page = (c: Context, title: string, body: Parameters<typeof layout>[1], status = 200) =>
    c.html(
      layout(title, body, { csrf: session.csrf(c), signedIn: opts.tokens.length > 0 && session.signedIn(c) }),
      status as 200,
      SECURITY_HEADERS,
    );

  const badRequest = (c: Context, message: string) =>
    page(c, 'Bad request', html`<h1>Bad request</h1><p class="err" id="error">${message}</p><p><a href="/">← runs</a></p>`, 400);

  const signedIn: MiddlewareHandler = async (c, next) => {
    if (session.signedIn(c)) return next();
    if (c.req.method === 'GET' && c.req.header('accept')?.includes('text/html')) return page(c, 'Sign in', loginPage(null), 401);
    return c.json({ error: { code: 'unauthorized', message: 'sign in first (POST /login with the token)', path: null, details: {} } }, 401);
  };
  const csrf: MiddlewareHandler = async (c, next) => {
    const sent =
      c.req.header('x-csrf-token') ??
      (c.req.header('content-type')?.includes('form') ? String((await c.req.parseBody()).csrf ?? '') : undefined);
    if (!session.checkCsrf(c, sent)) {
      return c.json(
        {
          error: {
            code: 'unauthorized',
            message: 'the CSRF token or the Origin does not match this session: reload the page',
            path: null,
            details: {},
          },
        },
        403,
      );
    }
    return next();
  };

  app.get('/assets/dashboard.js', (c) =>
    c.body(DASHBOARD_JS, 200, { 'content-type': 'text/javascript; charset=utf-8', 'cache-control': 'no-cache' }),
  );
  app.get('/assets/dashboard.css', (c) =>
    c.body(DASHBOARD_CSS, 200, { 'content-type': 'text/css; charset=utf-8', 'cache-control': 'no-cache' }),
  );

  app.get('/favicon.ico', (c) => c.body(null, 204));
  app.get('/login', (c) => page(c, 'Sign in', loginPage(null)));
  app.post('/login', opts.limitBody, async (c) => {
    // Login CSRF (a page elsewhere signing this browser in with its own token): there is no session
    // yet for a CSRF token to come from, so the browser's own word on where the form was posted from.
    if (fromElsewhere(c)) return page(c, 'Sign in', loginPage('This sign-in did not come from this server.'), 403);
    const body = await c.req.parseBody();
    const token = typeof body.token === 'string' ? body.token.trim() : '';
    if (opts.tokens.length > 0 && !session.accepts(token)) return page(c, 'Sign in', loginPage('That token is not accepted.'), 401);
    setCookie(c, SESSION_COOKIE, token, {
      httpOnly: true,
      sameSite: 'Strict',
      path: '/',
      maxAge: SESSION_MAX_AGE_S,
      secure: new URL(c.req.url).protocol === 'https:',
    });
    return c.redirect('/', 303);
  });
  app.post('/logout', opts.limitBody, signedIn, csrf, (c) => {
    deleteCookie(c, SESSION_COOKIE, { path: '/' });
    return c.redirect('/login', 303);
  });

  app.get('/', signedIn, async (c) => {
    const state = c.req.query('state') ?? '';
    const workflow = (c.req.query('workflow') ?? '').trim();
    const cursor = c.req.query('cursor') || undefined;
    const awaiting = state === AWAITING_APPROVAL;
    const workflows = opts.ratchet.registry.list().map((w) => w.name);
    // The API's rule for ?workflow= (a U+0000 would reach PostgreSQL, which refuses it).
    const filter = workflow ? workflowFilterSchema.safeParse(workflow) : null;
    if (filter && !filter.success) return badRequest(c, `workflow: ${filter.error.issues[0]!.message}`);
    try {
      // What awaits a person: the oldest first (waits_open_approval_idx), one bounded read narrowed to
      // the workflow in SQL; the awaiting view pages on with its own cursor.
      const pending = await pendingApprovalsPage(opts.ratchet.store.db, {
        ...(workflow ? { workflow } : {}),
        ...(awaiting && cursor ? { cursor } : {}),
        limit: awaiting ? APPROVALS_LISTED : APPROVALS_ON_LIST,
      });
      const approvals = { awaitingApproval: pending.approvals, moreAwaiting: pending.nextCursor !== null };
      if (awaiting) {
        return page(
          c,
          'Awaiting approval',
          listPage({ runs: [], nextCursor: pending.nextCursor, state, workflow, workflows, ...approvals }),
        );
      }
      const page1 = await opts.ratchet.listRuns({
        ...(RUN_STATES.includes(state as RunState) ? { states: [state as RunState] } : {}),
        ...(workflow ? { workflow } : {}),
        ...(cursor ? { cursor } : {}),
        limit: DASHBOARD_PAGE_SIZE,
      });
      return page(
        c,
        'Runs',
        listPage({
          runs: page1.runs,
          nextCursor: page1.nextCursor,
          state: RUN_STATES.includes(state as RunState) ? state : '',
          workflow,
          workflows,
          ...approvals,
        }),
      );
    } catch (err) {
      // A bad cursor is the caller's (400, said so); anything else (the database down) is ours: never an empty "No runs." page.
      if (err instanceof InvalidInputError) return badRequest(c, err.message);
      opts.logger.error({ event: 'dashboard_list_failed', err }, 'dashboard list failed');
      return page(
        c,
        'Error',
        html`<h1>Could not list runs</h1><p class="err" id="error">The server could not read the runs (see its log); try again.</p><p><a href="/">← runs</a></p>`,
        500,
      );
    }
  });

  /**
   * A run and what its page shows. The events are the newest EVENTS_SHOWN of the stream's final part
   * (readStreamTail: a contiguous run of the stream in stream order, ending where the stream is
   * final), so the page's script resumes the stream after the last one it has, missing nothing and
   * receiving nothing twice; the timeline is drawn from the same events. `earlier`: events before
   * the ones shown (counted for the page, which says so; only flagged for the panel's refreshes).
   */
  const loadRun = async (id: string, countEarlier: boolean) => {
    const db = opts.ratchet.store.db;
    // The events first, the run after: the run is never older than the events, so whatever it
    // shows that the events do not is still to come on the stream, and refreshes the panel then.
    // A panel refresh (countEarlier false) redraws from recent events: the bounded read, not a sort of a long run's every event.
    const tail = await readStreamTail(db, id, EVENTS_SHOWN, { recentOnly: !countEarlier });
    const run = await opts.ratchet.store.getRun(id);
    if (!run) throw new UnknownRunError(id);
    const [explanation, usage, waits] = await Promise.all([opts.ratchet.explain(id).catch(() => null), runUsage(db, id), waitsOf(db, id)]);
    const first = tail.events[0];
    const earlier = tail.earlier && first ? (countEarlier ? await countStreamBefore(db, id, first.position) : 1) : 0;
    return { run, events: tail.events, earlier, explanation, usage, waits };
  };
  app.get('/runs/:id', signedIn, async (c) => {
    const id = c.req.param('id');
    try {
      const { run, events, earlier, explanation, usage, waits } = await loadRun(id, true);
      return page(c, `Run ${id}`, runPage(run, events, explanation, session.csrf(c), usage, waits, earlier));
    } catch (err) {
      if (err instanceof UnknownRunError)
        return page(
          c,
          'Unknown run',
          html`<h1>Unknown run</h1><p>No run ${id} here (never submitted, or pruned).</p><p><a href="/">← runs</a></p>`,
          404,
        );
      throw err;
    }
  });
  app.get('/runs/:id/panel', signedIn, async (c) => {
    const { run, events, earlier, explanation, usage, waits } = await loadRun(c.req.param('id'), false);
    return c.html(runPanel(run, events, explanation, session.csrf(c), usage, waits, earlier > 0).text, 200, SECURITY_HEADERS);
  });
  app.get(
    '/runs/:id/stream',
    signedIn,
    streamHandler({ ratchet: opts.ratchet, hub: opts.hub, heartbeatMs: opts.heartbeatMs, logger: opts.logger }),
  );

  const action = (name: 'cancel' | 'retry') => async (c: Context) => {
    const id = c.req.param('id')!;
    const res = await opts.service[name](id);
    opts.logger.info({ event: `dashboard_${name}`, runId: id }, `run ${name} from the dashboard`);
    return c.req.header('accept')?.includes('application/json') ? c.json(res, 200) : c.redirect(`/runs/${id}`, 303);
  };
  app.post('/runs/:id/cancel', opts.limitBody, signedIn, csrf, action('cancel'));
  app.post('/runs/:id/retry', opts.limitBody, signedIn, csrf, action('retry'));

  // Approve / reject a stage awaiting approval: the API's decision (same service, same checks),
  // decided by this session's token identity (never the token), a rejection with its reason.
  const decide = (name: 'approve' | 'reject') => async (c: Context) => {
    const id = c.req.param('id')!;
    const stageId = c.req.param('stageId')!;
    const form = c.req.header('content-type')?.includes('form') ? await c.req.parseBody() : {};
    // The API's rule for a reason (its length, no U+0000): a 4xx with its path, nothing decided.
    const reason =
      typeof form.reason === 'string' && form.reason.trim() ? parseInput(decisionReasonSchema, form.reason, 'reason') : undefined;
    const by = session.identity(c);
    const res =
      name === 'approve'
        ? await waits.approve(id, { stageId, ...(reason ? { reason } : {}) }, by)
        : await waits.reject(id, { stageId, ...(reason ? { reason } : {}) }, by);
    opts.logger.info({ event: `dashboard_${name}`, runId: id, stageId, decidedBy: by }, `stage ${name} from the dashboard`);
    const note = name === 'approve' ? `stage approved: it runs next` : `stage rejected${reason ? `: ${reason}` : ''}`;
    return c.req.header('accept')?.includes('application/json') ? c.json({ ...res, note }, 200) : c.redirect(`/runs/${id}`, 303);
  };
  app.post('/runs/:id/stages/:stageId/approve', opts.limitBody, signedIn, csrf, decide('approve'));
  app.post('/runs/:id/stages/:stageId/reject', opts.limitBody, signedIn, csrf, decide('reject'));
}
