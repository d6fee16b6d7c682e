/**
 * The demo's record of each fault: when it started, when it was fully applied (for a site cut
 * off for N seconds: when it came back), the worst the matrix got afterwards, and how long after
 * the start every pod reached every pod again. Pure: the session feeds it snapshots.
 */

export interface FaultRecord {
  id: number;
  label: string;
  /** ms since the epoch */
  startedAt: number;
  /** When the fault was fully applied (the session sets it; undefined while applying). */
  appliedAt?: number;
  /** The fault could not be applied. */
  error?: string;
  /** The most matrix cells (one per pod pair and family) down in one snapshot since the start. */
  worstDown: number;
  /** Seconds from the start to the first all-green snapshot taken wholly after appliedAt. */
  recoveredAfterS?: number;
  /** Notes the session adds (e.g. "o3 ready after 12 s"). */
  notes: string[];
}

/** What the tracker needs from a snapshot: when its probes began and ended, and the result. */
export interface MatrixSample {
  startedAt: number;
  finishedAt: number;
  /** Cells down (one per ordered pod pair and family). */
  down: number;
  allGreen: boolean;
}

export function newRecord(id: number, label: string, now: number): FaultRecord {
  return { id, label, startedAt: now, worstDown: 0, notes: [] };
}

/** Updates the open records with one snapshot; returns new objects for the ones it changed. */
export function observe(records: readonly FaultRecord[], sample: MatrixSample): FaultRecord[] {
  return records.map((r) => {
    if (r.error !== undefined || r.recoveredAfterS !== undefined) return r;
    // A snapshot whose probes began before the fault started says nothing about it.
    if (sample.finishedAt < r.startedAt) return r;
    const next = { ...r, worstDown: Math.max(r.worstDown, sample.down) };
    if (sample.allGreen && r.appliedAt !== undefined && sample.startedAt >= r.appliedAt) {
      next.recoveredAfterS = Math.max(0, (sample.finishedAt - r.startedAt) / 1000);
    }
    return next;
  });
}

export type RecordState = 'applying' | 'recovering' | 'recovered' | 'failed';

export function recordState(r: FaultRecord): RecordState {
  if (r.error !== undefined) return 'failed';
  if (r.recoveredAfterS !== undefined) return 'recovered';
  return r.appliedAt === undefined ? 'applying' : 'recovering';
}

/** One line: "08:01:02 restart office router: 6 cells down at worst, all green again after 23.4 s". */
export function describeRecord(r: FaultRecord): string {
  const at = new Date(r.startedAt).toISOString().slice(11, 19);
  const notes = r.notes.length > 0 ? ` (${r.notes.join('; ')})` : '';
  const worst = r.worstDown === 0 ? 'no pod pair lost' : `${r.worstDown} cell${r.worstDown === 1 ? '' : 's'} down at worst`;
  switch (recordState(r)) {
    case 'failed': return `${at} ${r.label}: could not be done: ${r.error}`;
    case 'applying': return `${at} ${r.label}: in progress…${notes}`;
    case 'recovering': return `${at} ${r.label}: done, waiting for an all-green matrix (${worst} so far)${notes}`;
    case 'recovered': return `${at} ${r.label}: ${worst}; recovered in ${r.recoveredAfterS!.toFixed(1)} s${notes}`;
  }
}
