import { afterEach, describe, expect, it } from 'vitest';
import type { StageReady, Transport } from '../../src/transport/transport.js';

/** The behaviour every transport owes the worker; run against in-process and BullMQ. */
export function transportConformance(name: string, make: () => Promise<Transport>) {
  describe(`transport conformance: ${name}`, () => {
    const open: Transport[] = [];
    const mk = async () => {
      const t = await make();
      open.push(t);
      return t;
    };
    afterEach(async () => {
      for (const t of open.splice(0)) await t.close();
    });
    const until = async (pred: () => boolean, ms = 10_000) => {
      const end = Date.now() + ms;
      while (!pred()) {
        if (Date.now() > end) throw new Error('timed out');
        await new Promise((r) => setTimeout(r, 10));
      }
    };

    it('delivers a wake-up with the stage and attempt to a subscriber of the class, not to others', async () => {
      const t = await mk();
      const got: StageReady[] = [];
      const other: StageReady[] = [];
      await t.subscribe('alpha', async (r) => {
        if (r) got.push(r);
      });
      await t.subscribe('beta', async (r) => {
        if (r) other.push(r);
      });
      await new Promise((r) => setTimeout(r, 200)); // subscribers ready
      t.notify('alpha', { stageId: '101', attempt: 1 });
      await until(() => got.length > 0);
      expect(got[0]).toEqual({ stageId: '101', attempt: 1 });
      await new Promise((r) => setTimeout(r, 200));
      expect(other).toEqual([]);
      expect(t.healthy()).toBe(true);
    });

    it('holds a delayed wake-up until its delay has passed', async () => {
      const t = await mk();
      const at: number[] = [];
      await t.subscribe('alpha', async () => {
        at.push(Date.now());
      });
      await new Promise((r) => setTimeout(r, 200));
      const sent = Date.now();
      t.notify('alpha', { stageId: '102', attempt: 2 }, 700);
      await until(() => at.length > 0);
      expect(at[0]! - sent).toBeGreaterThanOrEqual(650);
    });

    it('stops delivering after unsubscribe, and notify never throws, even after close', async () => {
      const t = await mk();
      const got: StageReady[] = [];
      const unsubscribe = t.subscribe('alpha', async (r) => {
        if (r) got.push(r);
      });
      await new Promise((r) => setTimeout(r, 200));
      await unsubscribe();
      t.notify('alpha', { stageId: '103', attempt: 1 });
      await new Promise((r) => setTimeout(r, 500));
      expect(got).toEqual([]);
      await t.close();
      expect(() => t.notify('alpha', { stageId: '104', attempt: 1 })).not.toThrow();
    });
  });
}
