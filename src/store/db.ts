/**
 * The one interface the store speaks: a PostgreSQL pool or an embedded PGlite, same SQL.
 * Hot statements pass a `name` so the pg driver prepares them once per connection.
 */
export type Row = Record<string, unknown>;

export interface Queryable {
  query<R extends Row = Row>(text: string, params?: readonly unknown[], name?: string): Promise<R[]>;
}

export interface Db extends Queryable {
  readonly kind: 'postgres' | 'pglite';
  /** Runs `fn` in one transaction on one connection; rolls back when it throws. */
  transaction<T>(fn: (tx: Queryable) => Promise<T>): Promise<T>;
  /** Runs `fn` with one dedicated connection (outside a transaction), e.g. to hold an advisory lock. */
  withConnection<T>(fn: (conn: Queryable) => Promise<T>): Promise<T>;
  /** Applies the committed migrations under an advisory lock. */
  migrate(): Promise<void>;
  close(): Promise<void>;
}
