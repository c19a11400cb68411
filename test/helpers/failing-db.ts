import type { Db, Queryable } from '../../src/store/db.js';

/**
 * `db`, but the statement named `name` fails as a lost connection would (ECONNRESET) the first time it is asked, in
 * or out of a transaction. `failed()` says whether it has.
 */
export function failingOnce(db: Db, name: string): Db & { failed(): boolean } {
  let failed = false;
  const wrap = (q: Queryable): Db['query'] =>
    ((text, params, n, opts) => {
      if (n === name && !failed) {
        failed = true;
        return Promise.reject(Object.assign(new Error('Connection terminated unexpectedly'), { code: 'ECONNRESET' }));
      }
      return q.query(text, params, n, opts);
    }) as Db['query'];
  return Object.assign(Object.create(db) as Db, {
    query: wrap(db),
    transaction: ((fn, o) => db.transaction((tx) => fn({ query: wrap(tx) }), o)) as Db['transaction'],
    failed: () => failed,
  });
}
