/**
 * Wake-ups between whoever makes a stage ready and whoever can claim it. A transport only
 * carries wake-ups; PostgreSQL decides every claim (limits included), so a lost wake-up costs
 * latency (workers poll, a sweeper re-sends), never a stage.
 */
export interface StageReady {
  stageId: string;
  /** The attempt the next claim will create (job id `<stage>-<attempt>`). */
  attempt: number;
}

export interface SubscribeOptions {
  concurrency?: number;
}

export interface Transport {
  readonly kind: 'in-process' | 'bullmq';
  /**
   * A stage of `toolClass` is ready now, or after `delayMs` (a retry's backoff). Never throws.
   * Workers name a lane here (laneOf(toolClass, definitionHash), ./lane.ts), not the bare class.
   */
  notify(toolClass: string, ready: StageReady, delayMs?: number): void;
  /**
   * Calls `onWake` when a stage of `toolClass` may be ready; `onWake` resolves once a claim
   * has been tried (a BullMQ job is acknowledged then, never held for the stage's life).
   * `concurrency`: how many wake-ups may wait for their claim at once (the subscriber answers
   * several with one claim; default 1). Returns the unsubscribe.
   */
  subscribe(toolClass: string, onWake: (ready: StageReady | null) => Promise<void>, opts?: SubscribeOptions): () => Promise<void>;
  /** False while wake-ups cannot be trusted (Redis away): workers then poll PostgreSQL faster. */
  healthy(): boolean;
  close(): Promise<void>;
}
