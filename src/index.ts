/**
 * Ratchet's public API, every export by name. (Definitions, the engine facade and the
 * worker land on top of the store; see DESIGN.md.)
 */
export {
  RatchetError, InvalidInputError, IllegalTransitionError, DataDirLockedError, UnknownRunError, UnknownStageError, ERROR_CODES,
} from './errors.js';
export type { ErrorCode } from './errors.js';
export {
  STAGE_TRANSITIONS, RUN_TRANSITIONS, STAGE_STATES, RUN_STATES, TERMINAL_RUN_STATES, TERMINAL_STAGE_STATES,
  assertTransition, canTransition,
} from './planner/states.js';
export type { RunState, StageState } from './planner/states.js';
export { EVENT_TYPES } from './store/event-types.js';
export type { EventType } from './store/event-types.js';
export {
  openStore, DEFAULT_DATA_DIR, MEMORY_DATA_DIR, DatabaseUnavailableError, IdempotencyConflictError, LEASE_CONFIRMATION_MARGIN_MS,
} from './store/index.js';
export type {
  Store, StoreOptions, ClaimedStage, ExtendResult, ExtendVerdict, FinishRow, FinishVerdict, CreateRunInput, CreatedRun, RunRow,
  StageRow, EventRow, StageSpec,
} from './store/index.js';
