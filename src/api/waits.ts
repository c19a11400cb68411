import { createRoute, type OpenAPIHono } from '@hono/zod-openapi';
import { z } from 'zod';
import type { Ratchet } from '../engine.js';
import { tokenIdentity } from './auth.js';
import { ApiError, errorBodySchema } from './errors.js';
import { createWaitService } from './wait-service.js';
import {
  approvalListSchema,
  approvalsQuerySchema,
  approveBodySchema,
  decisionResponseSchema,
  rejectBodySchema,
  signalHeadersSchema,
  signalParamsSchema,
  signalResponseSchema,
  stageParamsSchema,
} from './wait-schemas.js';

/**
 * Waits (issue 10): signals and approval decisions. Mounted by app.ts with one line, behind the
 * same bearer auth, body limit and single-value headers as every /v1 route.
 */
const json = <S>(schema: S, description: string) => ({ description, content: { 'application/json': { schema } } });
const error = (description: string) => json(errorBodySchema, description);
const common = { 401: error('missing or wrong bearer token'), 503: error('the database did not answer; nothing was changed') };
const security = [{ bearer: [] }];

const signalRoute = createRoute({
  method: 'post',
  path: '/v1/runs/{id}/signals/{name}',
  operationId: 'signalRun',
  security,
  summary: "Send a signal: the body is its payload, checked by the waitForSignal step's schema (Signal-Id: delivered once)",
  request: {
    params: signalParamsSchema,
    headers: signalHeadersSchema,
    body: { required: true, content: { 'application/json': { schema: z.unknown().meta({ id: 'SignalPayload' }) } } },
  },
  responses: {
    200: json(signalResponseSchema, 'delivered to the waiting stage (or this Signal-Id was delivered before)'),
    202: json(signalResponseSchema, 'kept: the run has not reached the wait; the wait takes it when it starts'),
    400: error('the body is not JSON, or a bad Signal-Id'),
    404: error('unknown_run, or unknown_signal: no waitForSignal step of the run waits for this name'),
    409: error("already_terminal (the run ended), already_decided (the step's wait timed out), signal_id_conflict"),
    422: error("invalid_input: the payload does not fit the step's schema (the path names the value)"),
    ...common,
  },
});

const decisionResponses = {
  200: json(decisionResponseSchema, 'decided'),
  400: error('the body does not fit the request schema'),
  404: error('unknown_run, unknown_stage'),
  409: error('already_decided (another decision or the timeout came first), not_awaiting_approval'),
  ...common,
};

const approveRoute = createRoute({
  method: 'post',
  path: '/v1/runs/{id}/stages/{stageId}/approve',
  operationId: 'approveStage',
  security,
  summary: "Approve a gated tool call (optionally with an edited input, checked by the tool's schema): it is queued",
  // The body (approveBodySchema: input, reason, by) is optional and read by optionalBody: a declared body would make an empty one a 400.
  request: { params: stageParamsSchema },
  responses: { ...decisionResponses, 422: error("invalid_input: the edited input does not fit the tool's schema (the path names it)") },
});

const rejectRoute = createRoute({
  method: 'post',
  path: '/v1/runs/{id}/stages/{stageId}/reject',
  operationId: 'rejectStage',
  security,
  summary: "Reject a gated tool call: an agent hears the reason as the tool's answer; a static run fails with approval_rejected",
  // The body (rejectBodySchema: reason, by) is optional, read by optionalBody.
  request: { params: stageParamsSchema },
  responses: decisionResponses,
});

const approvalsRoute = createRoute({
  method: 'get',
  path: '/v1/approvals',
  operationId: 'listApprovals',
  security,
  summary: 'Stages that wait for a person, oldest first',
  request: { query: approvalsQuerySchema },
  responses: { 200: json(approvalListSchema, 'what waits for a decision'), 404: error('unknown_run'), ...common },
});

/** An approve / reject body is optional; when sent it must be a JSON object that fits its schema. */
async function optionalBody<S extends z.ZodType>(raw: Request, schema: S): Promise<z.output<S>> {
  const text = raw.body ? await raw.text() : '';
  if (text.trim().length === 0) return schema.parse({});
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw new ApiError(400, 'invalid_json', `the body is not JSON: ${(err as Error).message}`, { path: '$' });
  }
  const r = schema.safeParse(value);
  if (!r.success) {
    const issue = r.error.issues[0]!;
    const path = issue.code === 'unrecognized_keys' ? (issue.keys[0] ?? '$') : issue.path.map(String).join('.') || '$';
    throw new ApiError(400, 'invalid_request', `the body does not fit the request schema: ${issue.message} (at ${path})`, {
      path,
      details: { in: 'body' },
    });
  }
  return r.data;
}

export function mountWaitRoutes(app: OpenAPIHono, ratchet: Ratchet, tokens: readonly string[]): void {
  const waits = createWaitService(ratchet);
  app.openapi(signalRoute, async (c) => {
    const { id, name } = c.req.valid('param');
    const payload = c.req.valid('json');
    const res = await waits.signal(id, name, payload, {
      signalId: c.req.valid('header')['signal-id'],
      sentBy: tokenIdentity(c.req.header('authorization'), tokens),
    });
    return res.status === 'kept' && !res.duplicate ? c.json(res, 202) : c.json(res, 200);
  });
  // Bodies are read by hand (optionalBody): an approve without a body is the common case.
  app.openapi(approveRoute, async (c) => {
    const { id, stageId } = c.req.valid('param');
    const body = await optionalBody(c.req.raw, approveBodySchema);
    return c.json(await waits.approve(id, { ...body, stageId }, tokenIdentity(c.req.header('authorization'), tokens)), 200);
  });
  app.openapi(rejectRoute, async (c) => {
    const { id, stageId } = c.req.valid('param');
    const body = await optionalBody(c.req.raw, rejectBodySchema);
    return c.json(await waits.reject(id, { ...body, stageId }, tokenIdentity(c.req.header('authorization'), tokens)), 200);
  });
  app.openapi(approvalsRoute, async (c) => {
    const q = c.req.valid('query');
    return c.json(await waits.approvals({ ...(q.runId ? { runId: q.runId } : {}), ...(q.limit ? { limit: Number(q.limit) } : {}) }), 200);
  });
}
