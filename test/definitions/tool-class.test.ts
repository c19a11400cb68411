import { describe, expect, it } from 'vitest';
import { InvalidDefinitionError } from '../../src/errors.js';
import { defineToolClass, type ToolClassOptions } from '../../src/definitions/index.js';

const base: ToolClassOptions = { name: 'io', lease: '90s', heartbeat: '30s', timeout: '60s', maxDuration: '10m' };

function refusal(options: unknown): InvalidDefinitionError {
  try {
    defineToolClass(options as ToolClassOptions);
  } catch (err) {
    expect(err).toBeInstanceOf(InvalidDefinitionError);
    return err as InvalidDefinitionError;
  }
  throw new Error('expected the class to be refused');
}

describe('defineToolClass', () => {
  it('resolves durations to ms and applies the defaults', () => {
    const io = defineToolClass(base);
    expect(io).toEqual({
      kind: 'tool_class',
      name: 'io',
      leaseMs: 90_000,
      heartbeatMs: 30_000,
      timeoutMs: 60_000,
      maxDurationMs: 600_000,
      retry: { maxAttempts: 3, backoff: { initialMs: 1000, factor: 2, maxMs: 60_000, jitter: 0.2 }, maxElapsedMs: null },
      missedHeartbeats: 2,
      jitterMs: 1000,
      isolation: 'none',
      concurrency: null,
      rateLimit: null,
    });
    expect(Object.isFrozen(io)).toBe(true);
    expect(Object.isFrozen(io.retry)).toBe(true);
    expect(Object.isFrozen(io.retry.backoff)).toBe(true);
  });

  it('takes a global concurrency and a rate limit, and refuses bad ones', () => {
    const limited = defineToolClass({ ...base, concurrency: 2, rateLimit: { max: 5, per: '1s' } });
    expect(limited.concurrency).toBe(2);
    expect(limited.rateLimit).toEqual({ max: 5, perMs: 1000 });
    expect(refusal({ ...base, concurrency: 0 }).path).toContain('concurrency');
    expect(refusal({ ...base, rateLimit: { max: 5, per: '-1s' } }).path).toContain('rateLimit');
  });

  it('merges a partial retry policy over the defaults', () => {
    const io = defineToolClass({
      ...base,
      retry: { maxAttempts: 5, backoff: { initial: '2s', max: '1m' }, maxElapsed: '10m' },
      isolation: 'thread',
    });
    expect(io.retry).toEqual({
      maxAttempts: 5,
      backoff: { initialMs: 2000, factor: 2, maxMs: 60_000, jitter: 0.2 },
      maxElapsedMs: 600_000,
    });
    expect(io.isolation).toBe('thread');
  });

  it('refuses a lease that breaks the timing rule, naming the numbers', () => {
    const err = refusal({ ...base, lease: '10s', heartbeat: '5s', timeout: '5s' });
    expect(err.message).toContain('lease 10000 ms must exceed missedHeartbeats 2 × heartbeat 5000 ms + jitter 1000 ms = 11000 ms');
    expect(err.path).toBe('toolClass[io].lease');
    expect(err.details).toMatchObject({ leaseMs: 10_000, heartbeatMs: 5000, missedHeartbeats: 2, jitterMs: 1000, minimumLeaseMs: 11_001 });
  });

  it('applies the timing rule with the class own missedHeartbeats and jitter', () => {
    expect(refusal({ ...base, missedHeartbeats: 3 }).message).toContain(
      'missedHeartbeats 3 × heartbeat 30000 ms + jitter 1000 ms = 91000 ms',
    );
    expect(refusal({ ...base, lease: '61s', jitter: '1s' }).message).toContain('= 61000 ms');
    expect(defineToolClass({ ...base, lease: 61_001 }).leaseMs).toBe(61_001);
    expect(defineToolClass({ ...base, lease: '61s', jitter: 0 }).jitterMs).toBe(0);
  });

  it('refuses heartbeat >= lease', () => {
    expect(refusal({ ...base, heartbeat: '90s' }).message).toContain('heartbeat 90000 ms must be shorter than lease 90000 ms');
    expect(refusal({ ...base, heartbeat: '2m' }).path).toBe('toolClass[io].heartbeat');
  });

  it('refuses timeout >= maxDuration, naming both: maxDuration bounds the whole attempt, so it must outlast one call', () => {
    expect(refusal({ ...base, timeout: '11m' }).message).toContain('timeout 660000 ms must be shorter than maxDuration 600000 ms');
    const equal = refusal({ ...base, timeout: '10m' });
    expect(equal.message).toContain('timeout 600000 ms must be shorter than maxDuration 600000 ms');
    expect(equal.path).toBe('toolClass[io].timeout');
    expect(equal.details).toMatchObject({ timeoutMs: 600_000, maxDurationMs: 600_000 });
    expect(defineToolClass({ ...base, timeout: '599999ms' }).timeoutMs).toBe(599_999);
  });

  it('refuses negative, NaN and unparseable durations, and zero for a lease', () => {
    expect(refusal({ ...base, lease: -1 }).message).toMatch(/negative/);
    expect(refusal({ ...base, heartbeat: Number.NaN }).message).toMatch(/not finite/);
    expect(refusal({ ...base, timeout: 'a minute or so' }).message).toMatch(/cannot parse/);
    expect(refusal({ ...base, lease: 0 }).message).toMatch(/greater than 0/);
    expect(refusal({ ...base, lease: -1 }).path).toBe('toolClass[io].lease');
  });

  it('names every problem at once', () => {
    const err = refusal({ ...base, lease: -1, heartbeat: 'x', maxDuration: Number.NaN });
    expect(err.message).toMatch(/^3 problems/);
    expect((err.details.issues as { path: string }[]).map((i) => i.path)).toEqual([
      'toolClass[io].lease',
      'toolClass[io].heartbeat',
      'toolClass[io].maxDuration',
    ]);
  });

  it('refuses unknown keys', () => {
    const err = refusal({ ...base, concurency: 4 });
    expect(err.message).toMatch(/Unrecognized key.*concurency/);
    expect(refusal({ ...base, retry: { attempts: 3 } }).message).toMatch(/attempts/);
    expect(refusal({ ...base, retry: { backoff: { base: '1s' } } }).path).toBe('toolClass[io].retry.backoff');
  });

  it('refuses bad names', () => {
    for (const name of ['', '9io', 'io:fast', 'a b', 'x'.repeat(65)])
      expect(refusal({ ...base, name }).message).toMatch(/must be a letter/);
    expect(defineToolClass({ ...base, name: 'IO_fast-2' }).name).toBe('IO_fast-2');
  });

  it('refuses bad retry numbers', () => {
    expect(refusal({ ...base, retry: { maxAttempts: 0 } }).path).toBe('toolClass[io].retry.maxAttempts');
    expect(refusal({ ...base, retry: { maxAttempts: 1.5 } }).path).toBe('toolClass[io].retry.maxAttempts');
    expect(refusal({ ...base, retry: { backoff: { jitter: 1.5 } } }).path).toBe('toolClass[io].retry.backoff.jitter');
    expect(refusal({ ...base, retry: { backoff: { factor: 0.5 } } }).path).toBe('toolClass[io].retry.backoff.factor');
    expect(refusal({ ...base, retry: { backoff: { initial: '2m' } } }).message).toContain(
      'backoff.max 60000 ms must not be below backoff.initial 120000 ms',
    );
    expect(refusal({ ...base, missedHeartbeats: 0 }).path).toBe('toolClass[io].missedHeartbeats');
    expect(refusal({ ...base, isolation: 'process' }).path).toBe('toolClass[io].isolation');
  });

  it('refuses a non-object', () => {
    expect(refusal(undefined).code).toBe('invalid_definition');
    expect(refusal('io').path).toBe('toolClass');
  });
});
