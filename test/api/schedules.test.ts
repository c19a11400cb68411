import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiError } from '../../src/api/errors.js';
import { startApi, TOKEN, type Api } from './helpers.js';

/** /v1/schedules on a real server (embedded store) and the client's methods for it. */
let api: Api;
beforeAll(async () => {
  api = await startApi();
});
afterAll(async () => {
  await api?.close();
});

const rows = async () => {
  const [c] = await api.ratchet.store.db.query(`SELECT (SELECT count(*) FROM ratchet.schedules)::int AS schedules,
    (SELECT count(*) FROM ratchet.schedule_ticks)::int AS ticks, (SELECT count(*) FROM ratchet.runs)::int AS runs`);
  return c;
};
const post = (body: unknown, token?: string | null) =>
  api.http('/v1/schedules', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body), token });

describe('/v1/schedules', () => {
  it('creates, shows, lists, replaces and deletes a schedule', async () => {
    const created = await post({ name: 'nightly', cron: '30 2 * * *', timezone: 'Europe/Berlin', workflow: 'echo', input: { key: 'n' } });
    expect(created.status).toBe(201);
    expect(created.body).toMatchObject({
      created: true,
      schedule: {
        name: 'nightly',
        cron: '30 2 * * *',
        timezone: 'Europe/Berlin',
        workflow: 'echo',
        input: { key: 'n' },
        overlap: 'skip',
        catchUp: 'none',
        source: 'api',
        lastRunId: null,
      },
    });
    const next = new Date(created.body.schedule.nextTickAt as string);
    const berlinTime = new Intl.DateTimeFormat('en-GB', { timeZone: 'Europe/Berlin', timeStyle: 'short' }).format(next);
    expect(berlinTime).toBe('02:30');

    const got = await api.client.getSchedule('nightly');
    expect(got).toMatchObject({ name: 'nightly', recentTicks: [] });
    expect((await api.client.listSchedules()).map((s) => s.name)).toEqual(['nightly']);

    const replaced = await api.client.putSchedule({
      name: 'nightly',
      cron: '0 3 * * *',
      workflow: 'echo',
      input: { key: 'n' },
      catchUp: 2,
      overlap: 'allow',
    });
    expect(replaced).toMatchObject({ created: false, schedule: { cron: '0 3 * * *', timezone: 'UTC', catchUp: 2, overlap: 'allow' } });
    expect(replaced.schedule.createdAt).toBe(created.body.schedule.createdAt);

    expect(await api.client.deleteSchedule('nightly')).toEqual({ name: 'nightly', deleted: true });
    expect(await api.client.listSchedules()).toEqual([]);
    const gone = await api.http('/v1/schedules/nightly', { method: 'DELETE' });
    expect(gone.status).toBe(404);
    expect(gone.body).toMatchObject({ error: { code: 'unknown_schedule' } });
    await expect(api.client.getSchedule('nightly')).rejects.toMatchObject({ code: 'unknown_schedule', status: 404 });
  });

  it('refuses bad schedules with a 4xx naming the field, and persists nothing', async () => {
    const before = await rows();
    const good = { name: 'bad', cron: '0 * * * *', workflow: 'echo', input: { key: 'b' } };
    const cases: [unknown, number, string, string][] = [
      [{ ...good, cron: '61 * * * *' }, 422, 'invalid_input', 'schedule.cron'],
      [{ ...good, cron: 'whenever' }, 422, 'invalid_input', 'schedule.cron'],
      [{ ...good, timezone: 'Mars/Olympus_Mons' }, 422, 'invalid_input', 'schedule.timezone'],
      [{ ...good, workflow: 'no-such-workflow' }, 404, 'unknown_workflow', 'workflow'],
      [{ ...good, input: { key: 7 } }, 422, 'invalid_input', 'schedule.input.key'],
      [{ ...good, input: { key: 'x', extra: 1 } }, 422, 'invalid_input', 'schedule.input'],
      [{ ...good, overlap: 'queue' }, 400, 'invalid_request', 'overlap'],
      [{ ...good, catchUp: 0 }, 400, 'invalid_request', 'catchUp'],
      [{ ...good, name: 'has space' }, 400, 'invalid_request', 'name'],
      [{ ...good, surprise: true }, 400, 'invalid_request', 'surprise'],
    ];
    for (const [body, status, code, path] of cases) {
      const res = await post(body);
      expect(res.status, JSON.stringify(body)).toBe(status);
      expect(res.body.error.code, JSON.stringify(body)).toBe(code);
      expect(String(res.body.error.path), JSON.stringify(body)).toContain(path);
    }
    const notJson = await api.http('/v1/schedules', { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{' });
    expect(notJson.status).toBe(400);
    await expect(api.client.putSchedule({ ...good, cron: '99 * * * *' })).rejects.toBeInstanceOf(ApiError);
    expect(await rows()).toEqual(before);
  });

  it('needs the bearer token on every schedule route, and a refused request changes nothing', async () => {
    await api.client.putSchedule({ name: 'guarded', cron: '0 * * * *', workflow: 'echo', input: { key: 'g' } });
    const before = await rows();
    for (const token of [null, 'wrong-token-0123456789', `${TOKEN}x`]) {
      expect((await post({ name: 'sneaky', cron: '0 * * * *', workflow: 'echo', input: { key: 's' } }, token)).status).toBe(401);
      expect((await api.http('/v1/schedules', { token })).status).toBe(401);
      expect((await api.http('/v1/schedules/guarded', { token })).status).toBe(401);
      expect((await api.http('/v1/schedules/guarded', { method: 'DELETE', token })).status).toBe(401);
    }
    expect(await rows()).toEqual(before);
    expect((await api.client.getSchedule('guarded')).name).toBe('guarded');
  });

  it('a name no schedule can have (a U+0000 in it, which PostgreSQL refuses) is 404 unknown_schedule, not 500', async () => {
    await api.client.putSchedule({ name: 'kept', cron: '0 * * * *', workflow: 'echo', input: { key: 'k' } });
    const before = await rows();
    for (const name of ['%00', 'a%00b', 'kept%00']) {
      for (const method of ['GET', 'DELETE']) {
        const res = await api.http(`/v1/schedules/${name}`, { method });
        expect([res.status, res.body.error?.code, res.body.error?.path], `${method} ${name}`).toEqual([404, 'unknown_schedule', 'name']);
      }
    }
    expect(await rows()).toEqual(before);
    expect((await api.client.getSchedule('kept')).name).toBe('kept');
  });
});
