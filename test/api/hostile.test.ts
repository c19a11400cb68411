import { request as httpRequest } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, defineToolClass, defineWorkflow } from '../../src/definitions/index.js';
import { InvalidInputError } from '../../src/errors.js';
import { MAX_JSON_DEPTH } from '../../src/store/limits.js';
import { createTestDatabase, type TestDatabase } from '../helpers/pg.js';
import { apiWorkflows } from './fixtures.js';
import { counts, startApi, TOKEN, type Api } from './helpers.js';

/**
 * The task API tried as a careless or hostile client would, on PostgreSQL through a real
 * server on loopback: every bad request is a typed 4xx (status, error code, JSON path) and
 * writes nothing (row counts unchanged). No worker runs, so counts move only by submits.
 */
let db: TestDatabase;
let api: Api;
let runId: string;

/** A workflow whose input schema walks any JSON (z.json() recurses): the engine must refuse absurd depth before it does. */
const anyClass = defineToolClass({ name: 'any_class', lease: '3s', heartbeat: '1s', jitter: '200ms', timeout: '5s', maxDuration: '30s' });
const anyTool = defineTool({
  name: 'any_tool',
  description: 'takes any JSON',
  class: anyClass,
  input: z.json(),
  output: z.unknown(),
  run: async () => ({}),
});
const anything = defineWorkflow({ name: 'anything', input: z.json(), steps: [{ tool: anyTool }] });

beforeAll(async () => {
  db = await createTestDatabase('api_hostile');
  api = await startApi({ databaseUrl: db.url, poolSize: 10, bodyLimit: 1024 * 1024, workflows: [...apiWorkflows, anything] });
  runId = (await api.client.submit('orphan', { key: 'hostile-existing' })).id;
});
afterAll(async () => {
  await api?.close();
  await db?.drop();
});

const json = { 'content-type': 'application/json' };
const post = (body: string, headers: Record<string, string> = json) => api.http('/v1/runs', { method: 'POST', headers, body });
const deep = (depth: number, leaf = '1') => `${'['.repeat(depth)}${leaf}${']'.repeat(depth)}`;
const cursorOf = (text: string) => Buffer.from(text, 'utf8').toString('base64url');
const UUID = '01890f4e-0000-7000-8000-00000000cafe';

/** A request through node:http, so a header given as an array goes out as several header lines (fetch would join them). */
function rawRequest(
  method: string,
  path: string,
  headers: Record<string, string | string[]>,
  body?: string,
): Promise<{ status: number; body: any }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(`${api.server.url}${path}`, { method, headers: { authorization: `Bearer ${TOKEN}`, ...headers } }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => {
        text += d;
      });
      res.on('end', () => {
        let parsed: unknown = text;
        try {
          parsed = JSON.parse(text);
        } catch {
          /* not JSON */
        }
        resolve({ status: res.statusCode ?? 0, body: parsed });
      });
    });
    req.on('error', reject);
    req.end(body);
  });
}

/** Sends, then asserts the status, the error code and path, and that no row was written. */
async function refused(
  send: () => Promise<{ status: number; body: any }>,
  status: number,
  code: string,
  path?: string | RegExp,
): Promise<void> {
  const before = await counts(api.ratchet);
  const res = await send();
  expect(res.status, JSON.stringify(res.body).slice(0, 500)).toBe(status);
  expect(res.body).toMatchObject({ error: { code, message: expect.any(String) } });
  if (path !== undefined)
    expect(res.body.error.path).toMatch(typeof path === 'string' ? new RegExp(`^${path.replace(/[.[\]$]/g, '\\$&')}$`) : path);
  expect(await counts(api.ratchet)).toEqual(before);
}

describe('issue 9 item 14: each case a typed 4xx with nothing written', () => {
  it('an input nested 100,000 deep is 422 invalid_input (not a stack overflow)', async () => {
    await refused(() => post(`{"workflow":"echo","input":${deep(100_000)}}`), 422, 'invalid_input', /^input(\[0\])*$/);
    await refused(() => post(`{"workflow":"anything","input":${deep(100_000)}}`), 422, 'invalid_input', /^input(\[0\])*$/);
    await refused(
      () => post(`{"workflow":"echo","input":{"key":"a","more":${deep(100_000, '{}')}}}`),
      422,
      'invalid_input',
      /^input\.more/,
    );
  });

  it('a lone surrogate in an input string (or key) is 422 invalid_input with its path', async () => {
    await refused(() => post('{"workflow":"echo","input":{"key":"a\\ud800b"}}'), 422, 'invalid_input', 'input.key');
    await refused(() => post('{"workflow":"echo","input":{"key":"\\udc00"}}'), 422, 'invalid_input', 'input.key');
    await refused(() => post('{"workflow":"anything","input":{"\\ud800":1}}'), 422, 'invalid_input', 'input.\ud800');
    await refused(() => post('{"workflow":"anything","input":["ok \\ud83d\\ude00", "\\ude00\\ud83d"]}'), 422, 'invalid_input', 'input[1]');
  });

  it('a deadline of 0000-01-01T00:00:00Z (or another impossible date) is 422 invalid_input at deadline', async () => {
    for (const deadline of [
      '0000-01-01T00:00:00Z',
      '2030-02-30T00:00:00Z',
      '2030-01-01T25:00:00Z',
      '+012030-01-01T00:00:00Z',
      '-000001-01-01T00:00:00Z',
    ]) {
      await refused(() => post(JSON.stringify({ workflow: 'echo', input: { key: 'a' }, deadline })), 422, 'invalid_input', 'deadline');
    }
  });

  it('createdAfter or createdBefore of 0000-01-01T00:00:00Z is 400 invalid_request', async () => {
    await refused(() => api.http('/v1/runs?createdAfter=0000-01-01T00:00:00Z'), 400, 'invalid_request', 'createdAfter');
    await refused(() => api.http('/v1/runs?createdBefore=0000-01-01T00:00:00Z'), 400, 'invalid_request', 'createdBefore');
    await refused(
      () => api.http(`/v1/runs?createdAfter=${encodeURIComponent('0001-01-01T00:00:00+01:00')}`),
      400,
      'invalid_request',
      'createdAfter',
    );
  });

  it('a cursor that decodes to an impossible date is 422 invalid_input at the cursor', async () => {
    for (const at of [
      '2024-02-30T00:00:00.000000Z',
      '2024-13-45T99:99:99.000000Z',
      '0000-01-01T00:00:00.000000Z',
      '2023-02-29T12:00:00.000000Z',
    ]) {
      await refused(() => api.http(`/v1/runs?cursor=${cursorOf(`${at}|${UUID}`)}`), 422, 'invalid_input', 'listRuns.cursor');
    }
    // A cursor that decodes to a real date still works.
    expect((await api.http(`/v1/runs?cursor=${cursorOf(`2999-01-01T00:00:00.000000Z|${UUID}`)}`)).status).toBe(200);
  });

  it('events?after=9223372036854775808 (past bigint) is 400 invalid_request at after', async () => {
    await refused(() => api.http(`/v1/runs/${runId}/events?after=9223372036854775808`), 400, 'invalid_request', 'after');
    await refused(() => api.http(`/v1/runs/${runId}/events?after=9999999999999999999`), 400, 'invalid_request', 'after');
    expect(await api.http(`/v1/runs/${runId}/events?after=9223372036854775807`)).toMatchObject({ status: 200, body: { events: [] } });
  });

  const stream = (id: string, resume: { header?: string; query?: string }) =>
    api.http(`/v1/runs/${id}/stream${resume.query ? `?after=${resume.query}` : ''}`, {
      headers: resume.header ? { 'last-event-id': resume.header } : {},
    });
  const PAST_BIGINT = '9999999999999999999';

  it('stream Last-Event-ID past bigint is 400 invalid_request, not 500 (an unknown run too)', async () => {
    await refused(() => stream(runId, { header: PAST_BIGINT }), 400, 'invalid_request', 'Last-Event-ID');
    await refused(() => stream(UUID, { header: PAST_BIGINT }), 400, 'invalid_request', 'Last-Event-ID');
  });

  it('stream ?after past bigint is 400 invalid_request, not 500', async () => {
    await refused(() => stream(runId, { query: PAST_BIGINT }), 400, 'invalid_request', 'Last-Event-ID');
  });

  it('events?streamAfter past bigint is 400 invalid_request at streamAfter, not 500 (an unknown run too)', async () => {
    await refused(() => api.http(`/v1/runs/${runId}/events?streamAfter=${PAST_BIGINT}`), 400, 'invalid_request', 'streamAfter');
    await refused(() => api.http(`/v1/runs/${UUID}/events?streamAfter=${PAST_BIGINT}`), 400, 'invalid_request', 'streamAfter');
  });

  it("bigint's largest value still passes the check on the stream and streamAfter: answered as before", async () => {
    const max = '9223372036854775807';
    // Not an event of this run (422) or of no run (404), as before the check.
    await refused(() => stream(runId, { header: max }), 422, 'invalid_input', 'Last-Event-ID');
    await refused(() => stream(runId, { query: max }), 422, 'invalid_input', 'Last-Event-ID');
    await refused(() => api.http(`/v1/runs/${runId}/events?streamAfter=${max}`), 422, 'invalid_input', 'streamAfter');
    await refused(() => stream(UUID, { header: max }), 404, 'unknown_run');
    await refused(() => api.http(`/v1/runs/${UUID}/events?streamAfter=${max}`), 404, 'unknown_run');
    const first = (await api.client.events(runId)).events[0]!.id;
    expect(await api.http(`/v1/runs/${runId}/events?streamAfter=${first}`)).toMatchObject({ status: 200 });
  });

  it('two Idempotency-Key headers are 400 invalid_request, never joined into a new key "a, b"', async () => {
    const body = JSON.stringify({ workflow: 'echo', input: { key: 'dup' } });
    await refused(
      () => rawRequest('POST', '/v1/runs', { ...json, 'idempotency-key': ['dup-a', 'dup-b'] }, body),
      400,
      'invalid_request',
      'Idempotency-Key',
    );
    expect(await db.query("SELECT id FROM ratchet.runs WHERE idempotency_key LIKE 'dup-%'")).toEqual([]);
    // One header whose value holds a comma is one key, as before.
    expect((await rawRequest('POST', '/v1/runs', { ...json, 'idempotency-key': 'dup-a, dup-b' }, body)).status).toBe(202);
  });

  it('the same key and input with another deadline is 409 idempotency_conflict; the same deadline replays', async () => {
    const submit = (deadline?: unknown) =>
      api.http('/v1/runs', {
        method: 'POST',
        headers: { ...json, 'idempotency-key': 'deadline-key' },
        body: JSON.stringify({ workflow: 'echo', input: { key: 'dl' }, ...(deadline !== undefined ? { deadline } : {}) }),
      });
    const first = await submit('10m');
    expect(first.status).toBe(202);
    expect(await submit('10m')).toMatchObject({ status: 200, body: { id: first.body.id, created: false } });
    await refused(() => submit('20m'), 409, 'idempotency_conflict', 'Idempotency-Key');
    await refused(() => submit(), 409, 'idempotency_conflict', 'Idempotency-Key');
    await refused(() => submit('2999-01-01T00:00:00Z'), 409, 'idempotency_conflict', 'Idempotency-Key');
    // Without a deadline, the hash is what it always was: a key used with no deadline still replays.
    const noDeadline = () =>
      api.http('/v1/runs', {
        method: 'POST',
        headers: { ...json, 'idempotency-key': 'no-deadline-key' },
        body: JSON.stringify({ workflow: 'echo', input: { key: 'nd' } }),
      });
    const plain = await noDeadline();
    const again = await noDeadline();
    expect([plain.status, again.status, again.body.id]).toEqual([202, 200, plain.body.id]);
  });
});

describe('the engine refuses the same inputs (submit without HTTP)', () => {
  it('a lone surrogate, an absurd depth, a year-0 deadline, a key that is not text: InvalidInputError with the path, nothing written', async () => {
    let nested: unknown = 1;
    for (let i = 0; i < 100_000; i++) nested = [nested];
    const cases: [string, () => Promise<unknown>, RegExp][] = [
      ['lone surrogate', () => api.ratchet.submit('echo', { key: '\ud800' }), /^input\.key$/],
      ['absurd depth (strict schema)', () => api.ratchet.submit('echo', nested), /^input(\[0\])*$/],
      ['absurd depth (z.json())', () => api.ratchet.submit('anything', nested as z.core.util.JSONType), /^input(\[0\])*$/],
      ['one level past the limit', () => api.ratchet.submit('anything', JSON.parse(deep(MAX_JSON_DEPTH + 1))), /^input(\[0\])*$/],
      [
        'a lone surrogate in the idempotency key (a text column would store U+FFFD)',
        () => api.ratchet.submit('echo', { key: 'a' }, { idempotencyKey: 'k\udfff' }),
        /^submit\.options\.idempotencyKey$/,
      ],
      [
        'deadline in year 0',
        () => api.ratchet.submit('echo', { key: 'a' }, { deadline: new Date('0000-01-01T00:00:00Z') }),
        /^submit\.options\.deadline/,
      ],
    ];
    for (const [name, submit, path] of cases) {
      const before = await counts(api.ratchet);
      const err = await submit().then(
        () => null,
        (e: unknown) => e,
      );
      expect(err, name).toBeInstanceOf(InvalidInputError);
      expect((err as InvalidInputError).path, name).toMatch(path);
      expect(await counts(api.ratchet), name).toEqual(before);
    }
    // At the limit is fine.
    expect((await api.ratchet.submit('anything', JSON.parse(deep(MAX_JSON_DEPTH)))).created).toBe(true);
  });

  it('listRuns refuses a year-0 date and an impossible cursor with InvalidInputError', async () => {
    await expect(api.ratchet.listRuns({ createdAfter: new Date('0000-01-01T00:00:00Z') })).rejects.toMatchObject({
      code: 'invalid_input',
      path: 'listRuns.createdAfter',
    });
    await expect(api.ratchet.listRuns({ cursor: cursorOf(`2024-02-30T00:00:00.000000Z|${UUID}`) })).rejects.toMatchObject({
      code: 'invalid_input',
      path: 'listRuns.cursor',
    });
  });
});

describe('beyond the list: every parameter tried the wrong way', () => {
  type Send = () => Promise<{ status: number; body: any }>;
  const get =
    (path: string): Send =>
    () =>
      api.http(path);
  const submitWith =
    (extra: Record<string, unknown>): Send =>
    () =>
      post(JSON.stringify({ workflow: 'echo', input: { key: 'x' }, ...extra }));
  const cases: [string, Send, number, string, string | RegExp | undefined][] = [
    // content types and bodies
    [
      'no content type',
      () => api.http('/v1/runs', { method: 'POST', body: '{"workflow":"echo","input":{"key":"a"}}' }),
      415,
      'unsupported_media_type',
      '$',
    ],
    [
      'text/plain',
      () => post('{"workflow":"echo","input":{"key":"a"}}', { 'content-type': 'text/plain' }),
      415,
      'unsupported_media_type',
      '$',
    ],
    [
      'multipart',
      () => post('--x\r\n\r\n--x--', { 'content-type': 'multipart/form-data; boundary=x' }),
      415,
      'unsupported_media_type',
      '$',
    ],
    ['an empty body', () => post(''), 400, 'invalid_json', '$'],
    ['a body of null', () => post('null'), 400, 'invalid_request', '$'],
    ['a body that is a string', () => post('"echo"'), 400, 'invalid_request', '$'],
    ['a body that is only whitespace', () => post('   '), 400, 'invalid_json', '$'],
    ['trailing garbage', () => post('{"workflow":"echo","input":{}} x'), 400, 'invalid_json', '$'],
    ['a duplicated field', () => post('{"workflow":"echo","workflow":"nope","input":{"key":"a"}}'), 404, 'unknown_workflow', 'workflow'],
    // numbers out of range
    ['an input number past double range', () => post('{"workflow":"anything","input":{"n":1e400}}'), 422, 'invalid_input', 'input.n'],
    ['a deadline of 0 ms', submitWith({ deadline: 0 }), 400, 'invalid_request', 'deadline'],
    ['a negative deadline', submitWith({ deadline: -5 }), 400, 'invalid_request', 'deadline'],
    ['a fractional deadline', submitWith({ deadline: 1.5 }), 400, 'invalid_request', 'deadline'],
    ['a deadline of 1e300 ms', submitWith({ deadline: 1e300 }), 400, 'invalid_request', 'deadline'],
    ['a deadline of 2^40 ms', submitWith({ deadline: 2 ** 40 }), 422, 'invalid_input', 'deadline'],
    ['a deadline of ten years', submitWith({ deadline: '3650d' }), 422, 'invalid_input', 'deadline'],
    ['a deadline duration that is negative text', submitWith({ deadline: '-5m' }), 422, 'invalid_input', 'deadline'],
    ['a deadline of an empty string', submitWith({ deadline: '' }), 400, 'invalid_request', 'deadline'],
    ['a deadline as an object', submitWith({ deadline: { at: 'now' } }), 400, 'invalid_request', 'deadline'],
    // names and unknown fields
    ['an empty workflow', () => post('{"workflow":"","input":{}}'), 400, 'invalid_request', 'workflow'],
    ['a 201-character workflow', () => post(JSON.stringify({ workflow: 'w'.repeat(201), input: {} })), 400, 'invalid_request', 'workflow'],
    ['a workflow with a lone surrogate', () => post('{"workflow":"ec\\ud800ho","input":{}}'), 404, 'unknown_workflow', 'workflow'],
    [
      '__proto__ in a strict input',
      () => post('{"workflow":"echo","input":{"key":"a","__proto__":{"admin":true}}}'),
      422,
      'invalid_input',
      'input',
    ],
    ['a priority above 100', submitWith({ priority: 101 }), 400, 'invalid_request', 'priority'],
    ['a priority that is not an integer', submitWith({ priority: 1.5 }), 400, 'invalid_request', 'priority'],
    ['a priority as a string', submitWith({ priority: 'high' }), 400, 'invalid_request', 'priority'],
    ['an unknown top-level field', submitWith({ urgency: 1 }), 400, 'invalid_request', 'urgency'],
    [
      'an Idempotency-Key of spaces only',
      () => post(JSON.stringify({ workflow: 'echo', input: { key: 'a' } }), { ...json, 'idempotency-key': ' ' }),
      400,
      'invalid_request',
      'Idempotency-Key',
    ],
    // list filters and pages
    ['limit=-1', get('/v1/runs?limit=-1'), 400, 'invalid_request', 'limit'],
    ['limit=0', get('/v1/runs?limit=0'), 400, 'invalid_request', 'limit'],
    ['limit=1.5', get('/v1/runs?limit=1.5'), 400, 'invalid_request', 'limit'],
    ['limit=1e2', get('/v1/runs?limit=1e2'), 400, 'invalid_request', 'limit'],
    ['limit= (empty)', get('/v1/runs?limit='), 400, 'invalid_request', 'limit'],
    ['limit of 20 digits', get('/v1/runs?limit=99999999999999999999'), 400, 'invalid_request', 'limit'],
    ['limit twice', get('/v1/runs?limit=1&limit=2'), 400, 'invalid_request', 'limit'],
    ['state= (empty)', get('/v1/runs?state='), 400, 'invalid_request', 'state'],
    ['state with a trailing comma', get('/v1/runs?state=failed,'), 400, 'invalid_request', 'state'],
    ['state in capitals', get('/v1/runs?state=FAILED'), 400, 'invalid_request', 'state'],
    ['state twice', get('/v1/runs?state=failed&state=queued'), 400, 'invalid_request', 'state'],
    ['workflow= (empty)', get('/v1/runs?workflow='), 400, 'invalid_request', 'workflow'],
    ['workflow=%00', get('/v1/runs?workflow=%00'), 400, 'invalid_request', 'workflow'],
    ['createdAfter without an offset', get('/v1/runs?createdAfter=2024-01-01T00:00:00'), 400, 'invalid_request', 'createdAfter'],
    ['createdAfter of February 30th', get('/v1/runs?createdAfter=2024-02-30T00:00:00Z'), 400, 'invalid_request', 'createdAfter'],
    ['createdAfter of a five-digit year', get('/v1/runs?createdAfter=10000-01-01T00:00:00Z'), 400, 'invalid_request', 'createdAfter'],
    ['createdBefore as a number', get('/v1/runs?createdBefore=1700000000000'), 400, 'invalid_request', 'createdBefore'],
    ['a cursor that is not base64', get('/v1/runs?cursor=%21%21%21'), 422, 'invalid_input', 'listRuns.cursor'],
    ['a cursor of 201 characters', get(`/v1/runs?cursor=${'A'.repeat(201)}`), 400, 'invalid_request', 'cursor'],
    [
      'a cursor with a bad uuid',
      get(`/v1/runs?cursor=${cursorOf('2024-01-01T00:00:00.000000Z|not-a-uuid')}`),
      422,
      'invalid_input',
      'listRuns.cursor',
    ],
    [
      'a cursor with \\u0000',
      get(`/v1/runs?cursor=${cursorOf(`2024-01-01T00:00:00.000000Z|${UUID}\u0000`)}`),
      422,
      'invalid_input',
      'listRuns.cursor',
    ],
    ['a cursor with a lone surrogate', get(`/v1/runs?cursor=${cursorOf('\ud800')}`), 422, 'invalid_input', 'listRuns.cursor'],
    ['an unknown filter', get('/v1/runs?sort=asc'), 400, 'invalid_request', 'sort'],
    // ids
    ['a run id that is no uuid', get('/v1/runs/not-a-uuid'), 404, 'unknown_run', undefined],
    ['a run id of 101 characters', get(`/v1/runs/${'a'.repeat(101)}`), 400, 'invalid_request', 'id'],
    ['a run id with bad percent-encoding', get('/v1/runs/%E0%A4%A'), 404, 'unknown_run', undefined],
    ['a run id of %00', get('/v1/runs/%00'), 404, 'unknown_run', undefined],
    ['the nil uuid', get('/v1/runs/00000000-0000-0000-0000-000000000000'), 404, 'unknown_run', undefined],
    ['events of a bad id', get('/v1/runs/not-a-uuid/events'), 404, 'unknown_run', undefined],
    ['explain of a bad id', get('/v1/runs/%ff/explain'), 404, 'unknown_run', undefined],
    // event pages
    ['events after=-1', get(`/v1/runs/${UUID}/events?after=-1`), 400, 'invalid_request', 'after'],
    ['events after=abc', get(`/v1/runs/${UUID}/events?after=abc`), 400, 'invalid_request', 'after'],
    ['events after of 20 digits', get(`/v1/runs/${UUID}/events?after=18446744073709551616`), 400, 'invalid_request', 'after'],
    ['events limit=0', get(`/v1/runs/${UUID}/events?limit=0`), 400, 'invalid_request', 'limit'],
    ['events limit=1001', get(`/v1/runs/${UUID}/events?limit=1001`), 400, 'invalid_request', 'limit'],
    ['events with an unknown parameter', get(`/v1/runs/${UUID}/events?before=1`), 400, 'invalid_request', 'before'],
    // cancel and retry
    [
      'cancel with a body',
      () => api.http(`/v1/runs/${UUID}/cancel`, { method: 'POST', headers: json, body: '{"force":true}' }),
      400,
      'invalid_request',
      '$',
    ],
    ['retry of a bad id', () => api.http('/v1/runs/nope/retry', { method: 'POST' }), 404, 'unknown_run', undefined],
    ['cancel of an unknown run', () => api.http(`/v1/runs/${UUID}/cancel`, { method: 'POST' }), 404, 'unknown_run', undefined],
    [
      'two Content-Type lines',
      () => rawRequest('POST', '/v1/runs', { 'content-type': ['application/json', 'text/plain'] }, '{"workflow":"echo","input":{}}'),
      415,
      'unsupported_media_type',
      '$',
    ],
    [
      'two Authorization lines',
      () => rawRequest('GET', '/v1/runs', { authorization: [`Bearer ${TOKEN}`, 'Bearer other-token'] }),
      401,
      'unauthorized',
      undefined,
    ],
    // routes and methods
    ['an unknown route', get('/v1/nope'), 404, 'not_found', undefined],
    ['DELETE a run', () => api.http(`/v1/runs/${UUID}`, { method: 'DELETE' }), 404, 'not_found', undefined],
  ];
  for (const [name, send, status, code, path] of cases) {
    it(`${name} → ${status} ${code}`, async () => {
      await refused(send, status, code, path);
    });
  }
});

describe('fuzz: many malformed submits, never a 5xx, nothing written by the refused ones', () => {
  /** mulberry32: a small seeded PRNG, so a failure is reproducible from its seed. */
  function rng(seed: number): () => number {
    let a = seed >>> 0;
    return () => {
      a = (a + 0x6d2b79f5) >>> 0;
      let t = a;
      t = Math.imul(t ^ (t >>> 15), t | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
  }

  it('600 bodies from a seeded generator: each a 4xx or a created run, and rows grow only by the runs created', async () => {
    const seed = 9_14;
    const r = rng(seed);
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;
    // Leaves as raw JSON text, including what JSON.stringify would never write.
    const leaves = [
      '1',
      '-0',
      '1e400',
      '-1e400',
      '123456789012345678901234567890',
      '0.0000001',
      'true',
      'null',
      '""',
      '"a"',
      '"\\u0000"',
      '"\\ud800"',
      '"\\udfff\\ud800"',
      '"\\ud83d\\ude00"',
      '"\\uFFFF"',
      `"${'x'.repeat(2000)}"`,
      '{}',
      '[]',
      '"__proto__"',
    ];
    const keys = ['key', 'user', '', '__proto__', 'constructor', '\\u0000', '\\ud800', 'k'.repeat(300), 'nested'];
    const value = (depth: number): string => {
      const roll = r();
      if (depth > 4 || roll < 0.45) return pick(leaves);
      if (roll < 0.55) return deep(1 + Math.floor(r() * 3) * 150, pick(leaves));
      if (roll < 0.75) return `[${Array.from({ length: Math.floor(r() * 4) }, () => value(depth + 1)).join(',')}]`;
      return `{${Array.from({ length: Math.floor(r() * 4) }, () => `"${pick(keys)}":${value(depth + 1)}`).join(',')}}`;
    };
    const workflows = ['"anything"', '"anything"', '"anything"', '"echo"', '"echo"', '"nope"', '""', '1', 'null', '"\\u0000"', '["echo"]'];
    const deadlines = [
      '"10m"',
      '"0000-01-01T00:00:00Z"',
      '"2024-02-30T00:00:00Z"',
      '0',
      '-1',
      '1e300',
      '"soon"',
      'null',
      '{}',
      '"9999-12-31T23:59:59Z"',
    ];
    const body = (): string => {
      const fields = [`"workflow":${pick(workflows)}`, `"input":${value(0)}`];
      if (r() < 0.2) fields.push(`"deadline":${pick(deadlines)}`);
      if (r() < 0.1) fields.push(`"${pick(keys)}":${value(2)}`);
      let text = `{${fields.sort(() => r() - 0.5).join(',')}}`;
      // Byte-level damage now and then: a cut, a stray character, a doubled brace.
      const damage = r();
      if (damage < 0.08) text = text.slice(0, Math.floor(r() * text.length));
      else if (damage < 0.14) text = text.replace(/,/, ',,');
      else if (damage < 0.18) text = `${text}}`;
      return text;
    };

    const before = await counts(api.ratchet);
    const statuses = new Map<number, number>();
    let created = 0;
    for (let i = 0; i < 600; i++) {
      const text = body();
      const res = await post(text);
      statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1);
      expect(
        res.status < 500,
        `seed ${seed}, body ${i}: ${text.slice(0, 300)} → ${res.status} ${JSON.stringify(res.body).slice(0, 300)}`,
      ).toBe(true);
      if (res.status === 202) created += 1;
      else
        expect(res.body, `body ${i}: ${text.slice(0, 300)}`).toMatchObject({
          error: { code: expect.any(String), message: expect.any(String) },
        });
    }
    const after = await counts(api.ratchet);
    // Each created run writes one run, one stage and one event (no worker runs here).
    expect(after).toEqual({ runs: before.runs + created, stages: before.stages + created, events: before.events + created });
    expect([...statuses.keys()].every((s) => s === 202 || (s >= 400 && s < 500))).toBe(true);
    expect(statuses.get(422) ?? 0).toBeGreaterThan(100); // the generator does reach the engine's checks
  }, 120_000);

  it('400 query strings on the list and events routes from a seeded generator: never a 5xx', async () => {
    const r = rng(1414);
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(r() * xs.length)]!;
    const names = ['state', 'workflow', 'createdAfter', 'createdBefore', 'cursor', 'limit', 'after', 'x', '', '%00', 'state[]'];
    const values = [
      '',
      '0',
      '-1',
      '1',
      '500',
      '501',
      '1e3',
      '9223372036854775807',
      '9223372036854775808',
      'failed',
      'failed,queued',
      'nope',
      '0000-01-01T00:00:00Z',
      '2024-02-30T00:00:00Z',
      '9999-12-31T23:59:59Z',
      '%00',
      '%ED%A0%80',
      '%FF',
      'A'.repeat(300),
      cursorOf(`0000-01-01T00:00:00.000000Z|${UUID}`),
      cursorOf(`2024-01-01T00:00:00.000000Z|${UUID}`),
      cursorOf('garbage'),
      '%2B',
      '+',
    ];
    const before = await counts(api.ratchet);
    for (let i = 0; i < 400; i++) {
      const query = Array.from({ length: 1 + Math.floor(r() * 3) }, () => `${pick(names)}=${pick(values)}`).join('&');
      const path = r() < 0.5 ? `/v1/runs?${query}` : `/v1/runs/${pick([runId, UUID, 'x'])}/events?${query}`;
      const res = await api.http(path);
      expect(res.status < 500, `${path} → ${res.status} ${JSON.stringify(res.body).slice(0, 300)}`).toBe(true);
    }
    expect(await counts(api.ratchet)).toEqual(before);
  }, 120_000);
});
