import pino, { type Bindings, type Logger } from 'pino';

/**
 * The default logger: pino JSON on stderr, level from RATCHET_LOG_LEVEL (default `info`).
 * Logs carry ids, tokens, hashes, classes, durations and error codes — never prompts,
 * inputs or results.
 */
export function defaultLogger(): Logger {
  return pino({ name: 'ratchet', level: process.env.RATCHET_LOG_LEVEL ?? 'info' }, pino.destination(2));
}

export const silentLogger = (): Logger => pino({ level: 'silent' });

/**
 * `parent.child(bindings())`, made only when something is written through it. pino binds a
 * child's fields when the child is made (each value serialised, ~1 µs); a stage's logger at
 * `warn` writes nothing on most stages, so its child is never made. Until then a method of a
 * level that is off answers with the parent's (pino's no-op), and `isLevelEnabled`, `level`
 * and `levels` with the parent's (a child has its parent's level until one is set on it);
 * anything else — a line at an enabled level, `child`, `bindings`, a level set — makes the
 * child and goes to it. The bindings are read when the child is made.
 */
export function lazyChild(parent: Logger, bindings: () => Bindings): Logger {
  return new Proxy(parent, new LazyChild(parent, bindings));
}

/** lazyChild's proxy handler (a class: no closures made per stage). */
class LazyChild implements ProxyHandler<Logger> {
  private child: Logger | null = null;

  constructor(
    private readonly parent: Logger,
    private readonly bindings: () => Bindings,
  ) {}

  private made(): Logger {
    this.child ??= this.parent.child(this.bindings());
    return this.child;
  }

  get(_target: Logger, prop: string | symbol): unknown {
    const parent = this.parent;
    if (this.child === null) {
      if (prop === 'isLevelEnabled') return levelCheckOf(parent);
      if (prop === 'level' || prop === 'levels') return parent[prop];
      if (typeof prop === 'string' && Object.hasOwn(parent.levels.values, prop) && !parent.isLevelEnabled(prop)) {
        return parent[prop as 'info'];
      }
    }
    const target = this.made();
    const value: unknown = Reflect.get(target, prop, target);
    return typeof value === 'function' ? value.bind(target) : value;
  }

  set(_target: Logger, prop: string | symbol, value: unknown): boolean {
    return Reflect.set(this.made(), prop, value);
  }
}

/** `parent.isLevelEnabled`, bound once per parent. */
const levelChecks = new WeakMap<Logger, Logger['isLevelEnabled']>();
function levelCheckOf(parent: Logger): Logger['isLevelEnabled'] {
  let check = levelChecks.get(parent);
  if (!check) {
    check = parent.isLevelEnabled.bind(parent);
    levelChecks.set(parent, check);
  }
  return check;
}
