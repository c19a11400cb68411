/** HTML built from tagged templates: every interpolated value is escaped unless it is Html already. */
export class Html {
  constructor(readonly text: string) {}
  toString(): string {
    return this.text;
  }
}

const ESCAPES: Record<string, string> = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
export const escapeHtml = (s: string): string => s.replace(/[&<>"']/g, (c) => ESCAPES[c]!);

function piece(v: unknown): string {
  if (v instanceof Html) return v.text;
  if (Array.isArray(v)) return v.map(piece).join('');
  if (v === null || v === undefined || v === false) return '';
  return escapeHtml(String(v));
}

export function html(strings: TemplateStringsArray, ...values: unknown[]): Html {
  let out = strings[0]!;
  values.forEach((v, i) => {
    out += piece(v) + strings[i + 1]!;
  });
  return new Html(out);
}

/** Text that is already HTML (built by `html`, or a constant). */
export const raw = (s: string): Html => new Html(s);

export function layout(title: string, body: Html, opts: { csrf: string; signedIn: boolean }): string {
  return html`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="csrf-token" content="${opts.csrf}">
<title>${title} · Ratchet</title><link rel="stylesheet" href="/assets/dashboard.css"></head>
<body><header><a class="brand" href="/">Ratchet</a><span class="spacer"></span>
${opts.signedIn ? html`<form method="post" action="/logout"><input type="hidden" name="csrf" value="${opts.csrf}"><button class="link">sign out</button></form>` : ''}
</header><main>${body}</main><script src="/assets/dashboard.js"></script></body></html>`.text;
}

export const fmtTime = (d: Date | string | null): string =>
  d === null ? '-' : (typeof d === 'string' ? d : d.toISOString()).replace('T', ' ').replace(/\.\d+Z$/, 'Z');

export function fmtMs(ms: number): string {
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  if (ms < 3_600_000) return `${(ms / 60_000).toFixed(1)} min`;
  return `${(ms / 3_600_000).toFixed(1)} h`;
}

/** An error as code: message (errors are ours: codes and messages, never payloads). */
export function errorLine(e: unknown): string {
  if (e === null || e === undefined) return '';
  const { code, message } = e as { code?: unknown; message?: unknown };
  if (typeof message === 'string') return `${typeof code === 'string' ? `${code}: ` : ''}${message}`.slice(0, 500);
  return typeof code === 'string' ? code : 'error';
}
