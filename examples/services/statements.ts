import { createHash } from 'node:crypto';

/**
 * The statement source: a plain-text statement of account per invoice id, made up but stable
 * (the same id always gives the same statement). Ids starting with `missing-` do not exist.
 */
export const INVOICE_ID = /^[a-z0-9][a-z0-9-]{0,63}$/i;

const VENDORS = ['Northwind Traders', 'Contoso Ltd', 'Fabrikam Inc', 'Tailspin Toys', 'Wide World Importers'];
const CURRENCIES = ['EUR', 'USD', 'GBP'];
const CATALOG = [
  { item: 'Consulting hours', unitCents: 9500 },
  { item: 'Travel', unitCents: 24000 },
  { item: 'Licence seats', unitCents: 1200 },
  { item: 'Support plan', unitCents: 45000 },
  { item: 'Hardware tokens', unitCents: 3550 },
];

const money = (cents: number) => (cents / 100).toFixed(2);

export function statementText(invoiceId: string): string | null {
  if (!INVOICE_ID.test(invoiceId) || invoiceId.startsWith('missing-')) return null;
  const h = createHash('sha256').update(invoiceId).digest();
  const lines = Array.from({ length: 2 + (h[0]! % 3) }, (_, i) => {
    const entry = CATALOG[(h[1]! + i) % CATALOG.length]!;
    return { ...entry, qty: 1 + (h[2 + i]! % 12) };
  });
  const total = lines.reduce((sum, l) => sum + l.qty * l.unitCents, 0);
  const shortfall = h[6]! % 4 === 0 ? 0 : lines[0]!.unitCents; // most invoices were underpaid by one unit
  return [
    'STATEMENT OF ACCOUNT',
    `Invoice: ${invoiceId}`,
    `Vendor: ${VENDORS[h[7]! % VENDORS.length]}`,
    `Currency: ${CURRENCIES[h[8]! % CURRENCIES.length]}`,
    `Issued: 2024-${String(1 + (h[9]! % 12)).padStart(2, '0')}-${String(1 + (h[10]! % 28)).padStart(2, '0')}`,
    ...lines.map((l) => `Line: ${l.item} | ${l.qty} | ${money(l.unitCents)}`),
    `Invoice total: ${money(total)}`,
    `Amount paid: ${money(total - shortfall)}`,
    '',
  ].join('\n');
}
