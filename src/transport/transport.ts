/**
 * Wake-ups between whoever makes a stage ready and whoever can claim it. A transport only
 * carries wake-ups; PostgreSQL decides every claim, so a lost wake-up costs latency (the
 * worker polls), never a stage.
 */
export interface Transport {
  readonly kind: 'in-process' | 'bullmq';
  /** A stage of `toolClass` is ready now, or after `delayMs` (a retry's backoff). */
  notify(toolClass: string, stageId: string, delayMs?: number): void;
  /** Calls `onWake` when a stage of `toolClass` may be ready; returns the unsubscribe. */
  subscribe(toolClass: string, onWake: () => void): () => void;
  close(): Promise<void>;
}
