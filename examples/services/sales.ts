import { createHash } from 'node:crypto';

/**
 * The sales source for the report pipeline: per region and quarter, rows of
 * { sku, units, revenue } in the region's own currency (revenue a decimal string, as ledgers
 * export it). Made up but stable: the same region and period always give the same rows.
 */
export const REGION_CURRENCY = { emea: 'EUR', amer: 'USD', apac: 'AUD' } as const;
export type Region = keyof typeof REGION_CURRENCY;
export const PERIOD = /^\d{4}-Q[1-4]$/;

const SKUS = ['RT-100 ratchet set', 'RT-220 torque wrench', 'RT-310 socket kit', 'RT-450 impact driver', 'RT-500 tool chest'];

export interface SalesAnswer {
  region: Region;
  period: string;
  currency: string;
  rows: { sku: string; units: number; revenue: string }[];
}

export function salesFor(region: string, period: string): SalesAnswer | null {
  if (!(region in REGION_CURRENCY)) return null;
  const h = createHash('sha256').update(`${region}/${period}`).digest();
  const rows = SKUS.slice(0, 3 + (h[0]! % 3)).map((sku, i) => {
    const units = 10 + (h[1 + i]! % 90);
    const unitCents = 1999 + (h[6 + i]! % 50) * 100;
    return { sku, units, revenue: ((units * unitCents) / 100).toFixed(2) };
  });
  return { region: region as Region, period, currency: REGION_CURRENCY[region as Region], rows };
}
