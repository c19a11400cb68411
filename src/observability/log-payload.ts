import { createHash } from 'node:crypto';

/**
 * What a log line may say about a payload (an input, a result, a model's answer): its size and
 * a short hash — enough to tell two apart or match a line to a row — never the payload itself.
 * Only RATCHET_LOG_PAYLOADS=1 (an explicit choice, for a developer's own machine) adds it.
 */
export function logPayload(name: string, value: unknown): Record<string, unknown> {
  if (value === undefined) return {};
  const text = JSON.stringify(value) ?? 'null';
  const facts: Record<string, unknown> = {
    [`${name}Hash`]: createHash('sha256').update(text).digest('hex').slice(0, 16),
    [`${name}Bytes`]: Buffer.byteLength(text),
  };
  if (logPayloadsEnabled()) facts[name] = value;
  return facts;
}

export const logPayloadsEnabled = (): boolean => /^(1|true|yes)$/i.test(process.env.RATCHET_LOG_PAYLOADS ?? '');
