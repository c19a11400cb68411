import type { CheckConfig, History } from './history.js';
import { stageOfFence as stagesOfFences } from './leases.js';

/**
 * The invariants approval gates add (issue 10), over the recorded history:
 * - gated_effect_without_approval: every effect applied for a stage of a gated tool comes after
 *   an `approval_granted` event of that stage (by the database clock of both);
 * - effects_per_approval: at most one applied effect per approval of the stage.
 */
export type WaitInvariant = 'gated_effect_without_approval' | 'effects_per_approval';

export interface WaitStats {
  gatedStages: number;
  approvals: number;
  rejections: number;
  /** Signals delivered to a waiting stage or kept for one. */
  signals: number;
}

export function checkWaits(
  h: History,
  cfg: CheckConfig,
): { violations: { invariant: WaitInvariant; message: string; evidence: unknown }[]; stats: WaitStats } {
  const violations: { invariant: WaitInvariant; message: string; evidence: unknown }[] = [];
  const gatedTools = new Set(cfg.gatedTools ?? []);
  const gated = new Set(h.stageLog.filter((r) => gatedTools.has(r.tool)).map((r) => r.stageId));
  const stageOfFence = stagesOfFences(h.stageLog);
  const granted = new Map<string, number[]>();
  let rejections = 0;
  let signals = 0;
  for (const e of h.events ?? []) {
    if (e.type === 'approval_granted' && e.stageId !== null) granted.set(e.stageId, [...(granted.get(e.stageId) ?? []), e.at]);
    if (e.type === 'approval_rejected') rejections++;
    if (e.type === 'signal_received' || e.type === 'signal_kept') signals++;
  }
  const effects = new Map<string, typeof h.effects>();
  for (const ef of h.effects) {
    const s = stageOfFence.get(ef.fence);
    if (s !== undefined && gated.has(s)) effects.set(s, [...(effects.get(s) ?? []), ef]);
  }
  for (const [stageId, list] of effects) {
    const ok = granted.get(stageId) ?? [];
    for (const ef of list)
      if (!ok.some((t) => t < ef.at))
        violations.push({
          invariant: 'gated_effect_without_approval',
          message: `gated stage ${stageId}: effect of key ${ef.key} (fence ${ef.fence}) applied with no approval before it`,
          evidence: { effect: ef, approvals: ok, events: (h.events ?? []).filter((e) => e.stageId === stageId) },
        });
    if (list.length > ok.length)
      violations.push({
        invariant: 'effects_per_approval',
        message: `gated stage ${stageId}: ${list.length} applied effects for ${ok.length} approval(s)`,
        evidence: { effects: list, approvals: ok },
      });
  }
  return {
    violations,
    stats: { gatedStages: gated.size, approvals: [...granted.values()].reduce((n, l) => n + l.length, 0), rejections, signals },
  };
}
