/**
 * The engine bench's variant x concurrency matrix (bench/engine.ts): parsing --concurrency, picking each variant's
 * best concurrency, the "more processes never slower" check and CPU per stage. Pure, so test/bench-matrix.test.ts
 * covers it without a database.
 */

/** "10,50" -> [10, 50]: positive whole numbers, no duplicates, in the order given. */
export function parseConcurrencies(s: string): number[] {
  const parts = s.split(',').map((x) => x.trim());
  if (parts.length === 0 || parts.some((x) => !/^\d+$/.test(x) || Number(x) < 1))
    throw new Error(`--concurrency ${JSON.stringify(s)}: a list of positive whole numbers, e.g. 10,50`);
  const out: number[] = [];
  for (const c of parts.map(Number)) if (!out.includes(c)) out.push(c);
  return out;
}

export interface MatrixResult {
  /** queue | fast */
  mode: string;
  procs: number;
  concurrency: number;
  /** The variant without the concurrency, e.g. fast_path,procs=4 (nograce included). */
  base: string;
  stagesPerS: number;
  allOk: boolean;
}

/**
 * Per variant (base), the result of the highest stages/s among the runs that all succeeded; a variant with no such run
 * has no best (no "best concurrency" ratio is printed for it). `allOk` here is the measured phase's: the light-load
 * phase runs at the first concurrency only, so counting it would weigh the concurrencies differently.
 */
export function bestByVariant<T extends MatrixResult>(results: readonly T[]): Map<string, T> {
  const best = new Map<string, T>();
  for (const r of results) {
    if (!r.allOk) continue;
    const b = best.get(r.base);
    if (!b || r.stagesPerS > b.stagesPerS) best.set(r.base, r);
  }
  return best;
}

export interface ProcsCheck {
  mode: string;
  concurrency: number;
  /** [procs, stages/s] from the fewest to the most processes. */
  points: [number, number][];
  /** Each step's stages/s over the previous one's. */
  ratios: number[];
  ok: boolean;
}

/**
 * "More processes never slower": per mode and concurrency with at least two process counts, whether stages/s never
 * falls from fewer to more processes (strictly: any ratio below 1 fails; the ratios say by how much).
 */
export function moreProcsChecks(results: readonly MatrixResult[]): ProcsCheck[] {
  const groups = new Map<string, MatrixResult[]>();
  for (const r of results) {
    if (r.base.includes('nograce')) continue;
    const k = `${r.mode}\u0000${r.concurrency}`;
    groups.set(k, [...(groups.get(k) ?? []), r]);
  }
  const checks: ProcsCheck[] = [];
  for (const rs of groups.values()) {
    if (new Set(rs.map((r) => r.procs)).size < 2) continue;
    const points = [...rs].sort((a, b) => a.procs - b.procs).map((r): [number, number] => [r.procs, r.stagesPerS]);
    const ratios = points.slice(1).map(([, v], i) => Math.round((v / points[i]![1]) * 1000) / 1000);
    checks.push({ mode: rs[0]!.mode, concurrency: rs[0]!.concurrency, points, ratios, ok: ratios.every((x) => x >= 1) });
  }
  return checks;
}

/** CPU ms per succeeded stage: the workers, the PostgreSQL backends of the bench's database, their sum. */
export function cpuPerStage(cpuMsByKind: Record<string, unknown>, stages: number): { workers: number; postgres: number; total: number } {
  const n = Math.max(stages, 1);
  const workers = Math.round((Number(cpuMsByKind.ratchet_workers ?? 0) / n) * 1000) / 1000;
  const postgres = Math.round((Number(cpuMsByKind.postgres_this_db ?? 0) / n) * 1000) / 1000;
  return { workers, postgres, total: Math.round((workers + postgres) * 1000) / 1000 };
}
