import pino, { type Logger } from 'pino';
import { describe, expect, it } from 'vitest';
import { lazyChild } from '../../src/logger.js';

/**
 * The executor's per-stage logger (lazyChild): what it writes is what `parent.child(bindings)`
 * writes, line for line; the child (and its bindings) is made only once a line is written.
 */
function capture(level: string): { logger: Logger; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const logger = pino(
    { level, base: { worker: 'w1' }, timestamp: false },
    {
      write: (l: string) => {
        lines.push(JSON.parse(l) as Record<string, unknown>);
      },
    },
  );
  return { logger, lines };
}

const bindings = { runId: 'r-1', stageId: '42', fence: '7', tool: 'noop', toolClass: 'noop', attempt: 1 };

/** The same calls through a logger: lines at every level, a grandchild, a tool's ctx.log use. */
function exercise(log: Logger): void {
  log.trace({ event: 't' }, 'trace line');
  log.debug({ event: 'd' }, 'debug line');
  log.info({ event: 'i', n: 1 }, 'info line');
  log.warn({ event: 'w' }, 'warn line');
  log.error({ event: 'e', err: 'boom' }, 'error line');
  log.info('a message alone');
  log.child({ extra: true }).warn({ event: 'grandchild' }, 'from a child of it');
  const fn = log.warn; // taken off the object, as forwardLog does (then .call)
  fn.call(log, { event: 'detached' }, 'called detached');
  if (log.isLevelEnabled('debug')) log.debug({ event: 'guarded' }, 'guarded');
}

describe('lazyChild', () => {
  it.each(['trace', 'debug', 'info', 'warn', 'error', 'silent'])('writes what parent.child(bindings) writes, at level %s', (level) => {
    const eager = capture(level);
    exercise(eager.logger.child(bindings));
    const lazy = capture(level);
    exercise(lazyChild(lazy.logger, () => bindings));
    expect(lazy.lines).toEqual(eager.lines);
    if (level === 'warn') expect(lazy.lines.map((l) => l.event)).toEqual(['w', 'e', 'grandchild', 'detached']);
  });

  it('makes the child only when a line is written (or the child is needed), once', () => {
    const { logger, lines } = capture('warn');
    let made = 0;
    const log = lazyChild(logger, () => {
      made++;
      return bindings;
    });
    log.info({ event: 'off' }, 'not written');
    log.debug('not written');
    expect(log.isLevelEnabled('info')).toBe(false);
    expect(log.isLevelEnabled('warn')).toBe(true);
    expect(log.level).toBe('warn');
    expect(made).toBe(0);
    log.warn({ event: 'on' }, 'written');
    log.error({ event: 'on2' }, 'written');
    expect(made).toBe(1);
    expect(lines).toMatchObject([
      { event: 'on', runId: 'r-1', stageId: '42', worker: 'w1' },
      { event: 'on2', runId: 'r-1' },
    ]);
    expect(log.bindings()).toMatchObject(bindings);
  });

  it("a level set on it is the child's own, as with pino: the parent keeps its level", () => {
    const { logger, lines } = capture('warn');
    const log = lazyChild(logger, () => bindings);
    log.level = 'debug';
    log.debug({ event: 'now on' }, 'written');
    expect(logger.level).toBe('warn');
    expect(log.level).toBe('debug');
    expect(lines).toMatchObject([{ event: 'now on', stageId: '42' }]);
  });
});
