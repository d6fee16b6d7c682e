/**
 * Two robustness tests that mostly wait on the clock, run side by side (each on its own daemons
 * and namespaces) so the suite waits once:
 *
 * - the control socket under abuse (issue 8, item 4; robustness-uapi.ts): it ends when the
 *   daemon's 30 s request deadline disconnects the stalled clients;
 * - the soak (item 5; robustness-soak.ts): a 20 s transfer across rekeys and endpoint changes
 *   (ten minutes with ROAMGUARD_SOAK=1).
 *
 * Needs root, iproute2, wireguard-tools, iperf3 and /dev/net/tun.
 */
import { after, before, describe, test } from 'node:test';
import { reapStale, Scope } from './netns.ts';
import { requireDaemonPrerequisites } from './userspace-wg.ts';
import { CONTROL_SOCKET_TITLE, REQUEST_DEADLINE_MS, controlSocketAbuse, type Client } from './robustness-uapi.ts';
import { SECONDS, SOAK_TITLE, soak } from './robustness-soak.ts';

describe('robustness: the control socket under abuse, and a soak', { concurrency: true }, () => {
  before(async () => {
    await requireDaemonPrerequisites(['roamguard-node'], ['iperf3']);
    await reapStale();
  });
  const scopes: Scope[] = [];
  const clients: Client[] = [];
  after(async () => {
    for (const c of clients) c.destroy();
    for (const s of scopes) await s.cleanup();
  });
  const scope = () => {
    const s = new Scope();
    scopes.push(s);
    return s;
  };

  test(`control socket: ${CONTROL_SOCKET_TITLE}`, { timeout: REQUEST_DEADLINE_MS + 90_000 }, (tc) => controlSocketAbuse(tc, scope(), clients));
  test(`soak: ${SOAK_TITLE}`, { timeout: (SECONDS + 90) * 1000 }, (tc) => soak(tc, scope()));
});
