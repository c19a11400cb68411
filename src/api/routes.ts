import { createRoute } from '@hono/zod-openapi';
import { errorBodySchema } from './errors.js';
import {
  cancelResponseSchema,
  eventListSchema,
  eventsQuerySchema,
  explanationSchema,
  healthSchema,
  listQuerySchema,
  readySchema,
  retryResponseSchema,
  runIdParamsSchema,
  runListSchema,
  runViewSchema,
  submitBodySchema,
  submitHeadersSchema,
  submitResponseSchema,
} from './schemas.js';

/** The task API's routes as OpenAPI operations (served at /v1/openapi.json). */
const json = <S>(schema: S, description: string) => ({ description, content: { 'application/json': { schema } } });
const error = (description: string) => json(errorBodySchema, description);
const common = {
  401: error('missing or wrong bearer token'),
  503: error('the database did not answer (Retry-After says when to try again); nothing was changed by this request'),
};
const security = [{ bearer: [] }];
const runId = { params: runIdParamsSchema };

export const submitRoute = createRoute({
  method: 'post',
  path: '/v1/runs',
  operationId: 'submitRun',
  security,
  summary: 'Start a run (idempotent with Idempotency-Key)',
  request: { headers: submitHeadersSchema, body: { required: true, content: { 'application/json': { schema: submitBodySchema } } } },
  responses: {
    200: json(submitResponseSchema, 'this Idempotency-Key and body already made this run'),
    202: json(submitResponseSchema, 'a new run was accepted'),
    400: error('the body is not JSON, or does not fit the request schema (the path names the field)'),
    404: error('unknown_workflow'),
    409: error('idempotency_conflict: the key was used with another body'),
    413: error('the body is larger than the limit'),
    415: error('the body is not application/json'),
    422: error("invalid_input: the input does not fit the workflow's schema (the path names the value)"),
    ...common,
  },
});

export const getRunRoute = createRoute({
  method: 'get',
  path: '/v1/runs/{id}',
  operationId: 'getRun',
  security,
  summary: 'A run: its state, stages, result or error',
  request: runId,
  responses: { 200: json(runViewSchema, 'the run'), 404: error('unknown_run'), ...common },
});

export const listRunsRoute = createRoute({
  method: 'get',
  path: '/v1/runs',
  operationId: 'listRuns',
  security,
  summary: 'Runs, newest first, filtered, one page at a time',
  request: { query: listQuerySchema },
  responses: {
    200: json(runListSchema, 'one page of runs'),
    400: error('a filter that does not parse'),
    422: error('a cursor this server did not give'),
    ...common,
  },
});

export const eventsRoute = createRoute({
  method: 'get',
  path: '/v1/runs/{id}/events',
  operationId: 'listRunEvents',
  security,
  summary: "A run's durable history",
  request: { ...runId, query: eventsQuerySchema },
  responses: { 200: json(eventListSchema, 'events, oldest first'), 404: error('unknown_run'), ...common },
});

export const explainRoute = createRoute({
  method: 'get',
  path: '/v1/runs/{id}/explain',
  operationId: 'explainRun',
  security,
  summary: 'Why a run is where it is: a verdict and its evidence',
  request: runId,
  responses: { 200: json(explanationSchema, 'the verdict'), 404: error('unknown_run'), ...common },
});

export const cancelRoute = createRoute({
  method: 'post',
  path: '/v1/runs/{id}/cancel',
  operationId: 'cancelRun',
  security,
  summary: 'Cancel a run (a request a running stage already sent cannot be recalled)',
  request: runId,
  responses: {
    200: json(cancelResponseSchema, 'cancelled (or already cancelled)'),
    400: error('a body was sent: cancel takes none'),
    404: error('unknown_run'),
    409: error('already_terminal'),
    ...common,
  },
});

export const retryRoute = createRoute({
  method: 'post',
  path: '/v1/runs/{id}/retry',
  operationId: 'retryRun',
  security,
  summary: 'Retry a failed run from its failed stages (no body); an expired or cancelled run is resubmitted as a new run',
  request: runId,
  responses: {
    200: json(retryResponseSchema, 'the run goes on'),
    400: error('a body was sent: retry takes none'),
    404: error('unknown_run'),
    409: error('not_retryable'),
    ...common,
  },
});

export const healthRoute = createRoute({
  method: 'get',
  path: '/healthz',
  operationId: 'health',
  summary: 'The process answers (no token needed)',
  responses: { 200: json(healthSchema, 'alive') },
});

export const readyRoute = createRoute({
  method: 'get',
  path: '/readyz',
  operationId: 'ready',
  summary: 'The database answers (no token needed)',
  responses: { 200: json(readySchema, 'ready'), 503: json(readySchema, 'the database did not answer') },
});
