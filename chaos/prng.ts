/**
 * The soak's only source of randomness: mulberry32, seeded from --seed. What the seed decides
 * is planned before the soak starts, each item from its own fork (rng.fork('fault-' + k),
 * rng.fork('submit-' + i), rng.fork('flood-' + k + '-' + j)), drawn synchronously: so one seed
 * always plans the same schedule of faults and submits (printed under `plan` by --json), and
 * no item's draws depend on how many another made. What timing decides is not planned and may
 * differ between two runs of one seed: which free worker a fault hits (the planned pick is
 * applied to the workers free at that moment), whether a request came in time for a receiver
 * cut or a late request, how far each run had got when a fault hit, the version a chaos_roll
 * submit gets (the deploy's at that moment), which failed runs the retry loop finds, and a
 * planned item that must wait for its turn (starting later, or not at all at the end).
 */
export class Prng {
  private state: number;
  constructor(seed: number) {
    this.state = seed >>> 0;
  }
  /** [0, 1) */
  next(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }
  /** An integer in [min, max]. */
  int(min: number, max: number): number {
    return min + Math.floor(this.next() * (max - min + 1));
  }
  chance(p: number): boolean {
    return this.next() < p;
  }
  pick<T>(items: readonly T[]): T {
    if (items.length === 0) throw new RangeError('pick from an empty list');
    return items[Math.floor(this.next() * items.length)]!;
  }
  /** One of the keys, by weight. */
  weighted<K extends string>(weights: Readonly<Record<K, number>>): K {
    const entries = Object.entries(weights) as [K, number][];
    const total = entries.reduce((s, [, w]) => s + w, 0);
    let x = this.next() * total;
    for (const [k, w] of entries) {
      if ((x -= w) < 0) return k;
    }
    return entries[entries.length - 1]![0];
  }
  /** An independent generator for another concern (faults vs submits), so one does not shift the other. */
  fork(label: string): Prng {
    let h = this.state ^ 0x9e3779b9;
    for (const c of label) h = Math.imul(h ^ c.charCodeAt(0), 0x01000193) >>> 0;
    return new Prng(h);
  }
}
