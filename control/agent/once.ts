/**
 * "Say it once while it lasts": the ids of things already reported (a refused claim, a route
 * conflict). An item is new when its id was not reported before; ids no longer present are
 * forgotten, so a problem that comes back is reported again.
 */
export type Once = Set<string>;

export function newOnes<T>(reported: Once, current: ReadonlyArray<{ id: string; item: T }>): T[] {
  const ids = new Set(current.map((c) => c.id));
  for (const id of [...reported]) if (!ids.has(id)) reported.delete(id);
  const out: T[] = [];
  for (const c of current) {
    if (reported.has(c.id)) continue;
    reported.add(c.id);
    out.push(c.item);
  }
  return out;
}
