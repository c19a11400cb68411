import type { ClaimedStage } from '../../src/store/index.js';
import { monotonicNow } from '../../src/store/index.js';

/**
 * A claimed stage as the claim returns it, for tests of the Attempt and the lease keeper without a
 * database: a 60 s lease confirmed for 59 s more, 3 attempts, no run deadline. `over` replaces fields.
 */
export function claimedStage(id: string, over: Partial<ClaimedStage> = {}): ClaimedStage {
  return {
    id,
    runId: '00000000-0000-7000-8000-000000000000',
    seq: 1,
    name: 's',
    tool: 't',
    toolClass: 'c',
    state: 'running',
    fence: id,
    attempt: 1,
    maxAttempts: 3,
    input: {},
    idempotencyKey: 'k',
    leaseUntil: new Date(Date.now() + 60_000),
    leaseMs: 60_000,
    timeoutMs: 60_000,
    maxDurationMs: 120_000,
    claimedAt: new Date(),
    firstClaimedAt: new Date(),
    error: null,
    previousState: 'queued',
    previousFence: null,
    dbNow: new Date(),
    workflow: 'w',
    definitionHash: 'h',
    runInput: {},
    runDeadline: null,
    confirmedUntil: monotonicNow() + 59_000,
    sentAt: monotonicNow(),
    ...over,
  };
}
