/**
 * What was worked out from a text before, by the text: every pass at 5 000 Nodes parses, formats
 * and sorts the same 20 000 addresses and prefixes. Bounded: dropped whole when full (the texts
 * of a cluster that changes completely come back in the next pass). What it returns is shared
 * between callers: never modify it.
 */
export class TextCache<T> {
  private readonly entries = new Map<string, T>();

  constructor(private readonly work: (text: string) => T, private readonly limit = 100_000) {}

  /** What was remembered for `text`, or else `value`, now remembered for it. */
  remember(text: string, value: T): T {
    const known = this.entries.get(text);
    if (known !== undefined) return known;
    if (this.entries.size >= this.limit) this.entries.clear();
    this.entries.set(text, value);
    return value;
  }

  get(text: string): T {
    let value = this.entries.get(text);
    if (value === undefined) {
      value = this.work(text);
      if (this.entries.size >= this.limit) this.entries.clear();
      this.entries.set(text, value);
    }
    return value;
  }
}
