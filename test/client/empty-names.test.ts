import { describe, expect, it } from 'vitest';
import { ApiError } from '../../src/api/errors.js';
import { createClient } from '../../src/client/index.js';

/**
 * An empty run id, schedule name or stage id would make the path another route's (`/v1/runs/`
 * is the list): the client answers it as the server answers a name it does not hold, 404 with
 * the lookup's code, and sends nothing.
 */
describe('client: an empty name in a path', () => {
  it('is unknown_run / unknown_schedule / unknown_stage, with no request sent', async () => {
    const sent: string[] = [];
    const fetch: typeof globalThis.fetch = async (input) => {
      sent.push(String(input));
      return new Response('{}', { status: 500 });
    };
    const client = createClient({ baseUrl: 'http://127.0.0.1:1', token: 't', fetch });
    const cases: [string, () => Promise<unknown>][] = [
      ['unknown_run', () => client.get('')],
      ['unknown_run', () => client.events('')],
      ['unknown_run', () => client.cancel('')],
      ['unknown_run', () => client.retry('')],
      ['unknown_run', () => client.explain('')],
      ['unknown_run', () => client.signal('', 'paid', {})],
      ['unknown_run', () => client.approve('')],
      ['unknown_run', () => client.reject('', { stageId: '1' })],
      ['unknown_stage', () => client.approve('r1', { stageId: '' })],
      ['unknown_stage', () => client.reject('r1', { stageId: '' })],
      ['unknown_schedule', () => client.getSchedule('')],
      ['unknown_schedule', () => client.deleteSchedule('')],
    ];
    for (const [code, call] of cases) {
      const err = await call().then(
        () => null,
        (e: unknown) => e,
      );
      expect(err, code).toBeInstanceOf(ApiError);
      expect(err).toMatchObject({ status: 404, code });
    }
    expect(sent).toEqual([]);
  });
});
