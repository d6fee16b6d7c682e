/** The time-left estimate of the progress lines. */

/**
 * Seconds left: the planned seconds of the steps still to run, scaled by how the run has gone so
 * far (actual ÷ planned, kept between 0.8 and 2) once a fifth of the plan is behind.
 */
export function estimateSecondsLeft(plannedLeft: number, plannedDone: number, actualDone: number): number {
  const total = plannedLeft + plannedDone;
  if (!(total > 0) || !(plannedDone > 0) || plannedDone < 0.2 * total || !(actualDone > 0)) return plannedLeft;
  return plannedLeft * Math.min(2, Math.max(0.8, actualDone / plannedDone));
}

/** `45s`, `1m05s`. */
export const formatDuration = (s: number): string => {
  const whole = Math.max(0, Math.round(s));
  return whole >= 60 ? `${Math.floor(whole / 60)}m${String(whole % 60).padStart(2, '0')}s` : `${whole}s`;
};
