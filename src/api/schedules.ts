import { createRoute, type OpenAPIHono } from '@hono/zod-openapi';
import { z } from 'zod';
import type { Ratchet } from '../engine.js';
import { ApiError, errorBodySchema } from './errors.js';
import {
  scheduleBodySchema,
  scheduleDeleteResponseSchema,
  scheduleDetailSchema,
  scheduleListSchema,
  schedulePutResponseSchema,
  scheduleToJson,
  tickToJson,
} from './schedule-schemas.js';
import { SCHEDULE_NAME } from '../schedules/spec.js';

/**
 * /v1/schedules: cron schedules as the API shows them (src/schedules/). Mounted by app.ts with
 * one line; the client (ratchet/client) parses answers with the same schemas.
 */
const json = <S>(schema: S, description: string) => ({ description, content: { 'application/json': { schema } } });
const error = (description: string) => json(errorBodySchema, description);
const common = { 401: error('missing or wrong bearer token'), 503: error('the database did not answer; nothing was changed') };
const security = [{ bearer: [] }];
const nameParams = z.object({ name: z.string().min(1).max(200) });

const putRoute = createRoute({
  method: 'post',
  path: '/v1/schedules',
  operationId: 'putSchedule',
  security,
  summary: 'Create (or replace) a cron schedule',
  request: { body: { required: true, content: { 'application/json': { schema: scheduleBodySchema } } } },
  responses: {
    200: json(schedulePutResponseSchema, 'replaced'),
    201: json(schedulePutResponseSchema, 'created'),
    400: error('the body does not fit the request schema'),
    404: error('unknown_workflow'),
    422: error('invalid_input: a cron that does not parse, an unknown time zone, or an input the workflow refuses (the path names it)'),
    ...common,
  },
});
const listRoute = createRoute({
  method: 'get',
  path: '/v1/schedules',
  operationId: 'listSchedules',
  security,
  summary: 'Every schedule, by name',
  responses: { 200: json(scheduleListSchema, 'the schedules'), ...common },
});
const getRoute = createRoute({
  method: 'get',
  path: '/v1/schedules/{name}',
  operationId: 'getSchedule',
  security,
  summary: 'A schedule and its latest decided ticks',
  request: { params: nameParams },
  responses: { 200: json(scheduleDetailSchema, 'the schedule'), 404: error('unknown_schedule'), ...common },
});
const deleteRoute = createRoute({
  method: 'delete',
  path: '/v1/schedules/{name}',
  operationId: 'deleteSchedule',
  security,
  summary: 'Delete a schedule (runs it started are kept; one defined in code comes back when a process that defines it starts)',
  request: { params: nameParams },
  responses: { 200: json(scheduleDeleteResponseSchema, 'deleted'), 404: error('unknown_schedule'), ...common },
});

const unknown = (name: string) => new ApiError(404, 'unknown_schedule', `no schedule named "${name}"`, { path: 'name', details: { name } });
/**
 * The name of a schedule that can exist: every schedule is created through SCHEDULE_NAME (the API's
 * body, defineSchedule), so another name (a U+0000 in it, which PostgreSQL would refuse as text) is
 * 404 without asking the database.
 */
const existingName = (name: string): string => {
  if (!SCHEDULE_NAME.test(name)) throw unknown(name);
  return name;
};

export function mountScheduleRoutes(app: OpenAPIHono, ratchet: Ratchet): void {
  app.openapi(putRoute, async (c) => {
    const { schedule, created } = await ratchet.schedules.put(c.req.valid('json'));
    const body = { schedule: scheduleToJson(schedule), created };
    return created ? c.json(body, 201) : c.json(body, 200);
  });
  app.openapi(listRoute, async (c) => c.json({ schedules: (await ratchet.schedules.list()).map(scheduleToJson) }, 200));
  app.openapi(getRoute, async (c) => {
    const name = existingName(c.req.valid('param').name);
    const s = await ratchet.schedules.get(name);
    if (!s) throw unknown(name);
    return c.json({ ...scheduleToJson(s), recentTicks: (await ratchet.schedules.ticks(name)).map(tickToJson) }, 200);
  });
  app.openapi(deleteRoute, async (c) => {
    const name = existingName(c.req.valid('param').name);
    if (!(await ratchet.schedules.delete(name))) throw unknown(name);
    return c.json({ name, deleted: true as const }, 200);
  });
}
