/** One server-sent event as the wire carries it (https://html.spec.whatwg.org/multipage/server-sent-events.html). */
export interface SseMessage {
  /** The `id:` field, when the message had one. */
  id: string | null;
  event: string;
  data: string;
}

export interface SseParser {
  /** Feeds decoded text; returns the messages it completes. Comment lines are dropped. */
  push(text: string): SseMessage[];
}

/** A minimal SSE parser: fields per line, a blank line ends a message, `:` starts a comment. */
export function createSseParser(): SseParser {
  let buffer = '';
  let data: string[] = [];
  let event = '';
  let id: string | null = null;
  const line = (l: string, out: SseMessage[]) => {
    if (l === '') {
      if (data.length > 0) out.push({ id, event: event || 'message', data: data.join('\n') });
      data = [];
      event = '';
      id = null;
      return;
    }
    if (l.startsWith(':')) return;
    const colon = l.indexOf(':');
    const field = colon < 0 ? l : l.slice(0, colon);
    let value = colon < 0 ? '' : l.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'data') data.push(value);
    else if (field === 'event') event = value;
    else if (field === 'id' && !value.includes('\u0000')) id = value;
  };
  return {
    push(text) {
      buffer += text;
      const out: SseMessage[] = [];
      for (;;) {
        const m = /\r\n|\r|\n/.exec(buffer);
        if (!m) break;
        // A lone \r at the very end may be the first half of \r\n: wait for the next chunk.
        if (m[0] === '\r' && m.index === buffer.length - 1) break;
        line(buffer.slice(0, m.index), out);
        buffer = buffer.slice(m.index + m[0].length);
      }
      return out;
    },
  };
}
