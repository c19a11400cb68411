/** Definitions: tool classes, tools, workflows, their loader and registry. */
export { parseDuration, resolveDuration, durationSchema, positiveDurationSchema, MAX_DURATION_MS } from './duration.js';
export { DEFAULT_RETRY_POLICY, retryOptionsSchema, mergeRetryPolicy } from './retry-policy.js';
export type { RetryOptions } from './retry-policy.js';
export {
  defineToolClass,
  toolClassOptionsSchema,
  TOOL_CLASS_NAME,
  DEFAULT_MISSED_HEARTBEATS,
  DEFAULT_CLASS_JITTER_MS,
} from './tool-class.js';
export type { ToolClassOptions } from './tool-class.js';
export { defineTool, toolOptionsSchema, TOOL_NAME } from './tool.js';
export type { ToolOptions } from './tool.js';
export {
  defineWorkflow,
  workflowOptionsSchema,
  toolStepSchema,
  mapStepSchema,
  childStepSchema,
  WORKFLOW_NAME,
  MAX_STEPS,
  MAP_DEFAULT_MAX_ITEMS,
  MAP_MAX_ITEMS_LIMIT,
} from './workflow.js';
export type {
  StepOptions,
  ToolStepOptions,
  MapStepOptions,
  ChildStepOptions,
  SleepStepOptions,
  SignalStepOptions,
  WorkflowOptions,
} from './workflow.js';
export {
  CONTROL_CLASS,
  CONTROL_CLASS_NAME,
  CHILD_RUN_TOOL,
  CHILD_RUN_TOOL_NAME,
  SLEEP_TOOL,
  SLEEP_TOOL_NAME,
  SIGNAL_TOOL,
  SIGNAL_TOOL_NAME,
  AGENT_SLEEP_TOOL,
} from './builtin.js';
export { MAX_WAIT_MS, DEFAULT_AGENT_SLEEP_MAX_MS, AGENT_SLEEP_TOOL_NAME, SIGNAL_NAME, waitDurationSchema } from './waits.js';
export { resolveAfter, checkGraph } from './graph.js';
export { defineWorkflowTool, workflowToolOptionsSchema } from './workflow-tool.js';
export type { WorkflowToolOptions } from './workflow-tool.js';
export { toolJsonSchema, schemaFingerprint, nonJsonParts } from './json-schema.js';
export { canonicalJson, workflowHash, toolFingerprint, toolClassFingerprint } from './fingerprint.js';
export { isTool, isToolClass, isWorkflow, isZodSchema } from './guards.js';
export { loadWorkflows, WorkflowLoadError } from './loader.js';
export { createRegistry } from './registry.js';
export type { Registry } from './registry.js';
export type {
  Duration,
  Backoff,
  RetryPolicy,
  ToolClass,
  ToolContext,
  ReconcileResult,
  Tool,
  StepInputArgs,
  Step,
  StepKind,
  MapSpec,
  ChildWorkflowSpec,
  SleepSpec,
  SignalSpec,
  ApprovalSpec,
  Workflow,
  AgentSpec,
} from './types.js';
