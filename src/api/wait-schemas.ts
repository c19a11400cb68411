import { z } from 'zod';
import { isStorableText } from '../store/json.js';
import { idempotencyKeySchema } from './schemas.js';

/** Bodies and answers of the wait routes (issue 10), in plain zod: the server validates with them, the client parses with them. */
const ts = z.iso.datetime({ offset: true });

export const signalParamsSchema = z.object({
  id: z.string().min(1).max(200),
  name: z.string().min(1).max(64),
});
/** `Signal-Id`: one id is delivered once; sent again with the same name and payload, the first outcome comes back. */
export const signalHeadersSchema = z.object({ 'signal-id': idempotencyKeySchema.optional() });

export const signalResponseSchema = z
  .object({
    runId: z.string(),
    name: z.string(),
    signalId: z.string(),
    status: z.enum(['delivered', 'kept']).describe("delivered: the waiting stage took it; kept: the run's wait takes it when it starts"),
    duplicate: z.boolean().describe('this Signal-Id was delivered before: nothing changed'),
    stageId: z.string().nullable(),
    receivedAt: ts,
  })
  .strict()
  .meta({ id: 'SignalDelivery' });
export type SignalResponse = z.infer<typeof signalResponseSchema>;

export const stageParamsSchema = z.object({ id: z.string().min(1).max(200), stageId: z.string().regex(/^\d{1,19}$/, 'a stage id') });

/** Stored as text and in an event's JSON: no U+0000, no lone surrogate (PostgreSQL refuses both; one rule, src/store/json.ts). */
const storable = 'must be Unicode text without \\u0000';
/** Why a person decided (approve / reject): the API's body and the dashboard's form alike. */
export const decisionReasonSchema = z.string().trim().min(1).max(2000).refine(isStorableText, storable);
const by = z.string().trim().min(1).max(200).refine(isStorableText, storable).describe("the person's name, recorded beside the token");

export const approveBodySchema = z
  .object({
    input: z.unknown().optional().describe("an edited input for the tool, checked by the tool's schema (422 with its path)"),
    reason: decisionReasonSchema.optional(),
    by: by.optional(),
  })
  .strict()
  .meta({ id: 'Approve' });
export type ApproveBody = z.infer<typeof approveBodySchema>;

export const rejectBodySchema = z
  .object({ reason: decisionReasonSchema.optional().describe('why: an agent hears it as the answer of the tool call'), by: by.optional() })
  .strict()
  .meta({ id: 'Reject' });
export type RejectBody = z.infer<typeof rejectBodySchema>;

export const decisionResponseSchema = z
  .object({
    runId: z.string(),
    stageId: z.string(),
    decision: z.enum(['approved', 'rejected']),
    decidedBy: z.string().describe("the token's identity (a hash, never the token)"),
    actor: z.string().nullable(),
    decidedAt: ts,
    reason: z.string().nullable(),
    inputHash: z.string().nullable().describe('sha256 of the edited input, when one was given'),
    runEnded: z.enum(['succeeded', 'failed']).nullable().describe('the decision ended the run (a static run fails on a rejection)'),
  })
  .strict()
  .meta({ id: 'Decision' });
export type DecisionResponse = z.infer<typeof decisionResponseSchema>;

export const approvalsQuerySchema = z.object({
  runId: z.string().min(1).max(200).optional(),
  limit: z
    .string()
    .regex(/^\d{1,3}$/, 'a number 1..500')
    .refine((v) => Number(v) >= 1 && Number(v) <= 500, 'a number 1..500')
    .optional(),
});

export const pendingApprovalSchema = z
  .object({
    runId: z.string(),
    workflow: z.string(),
    stageId: z.string(),
    seq: z.number().int(),
    name: z.string(),
    tool: z.string(),
    input: z.unknown(),
    since: ts,
    timeoutAt: ts.nullable(),
  })
  .strict();
export const approvalListSchema = z
  .object({ approvals: z.array(pendingApprovalSchema) })
  .strict()
  .meta({ id: 'PendingApprovals' });
export type ApprovalListJson = z.infer<typeof approvalListSchema>;
