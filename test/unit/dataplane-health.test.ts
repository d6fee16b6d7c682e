/**
 * `roamguard health` (the data plane container's liveness probe, deploy/roamguard.yaml) against
 * a real control socket served by a Device: healthy when it answers and nothing is stalled,
 * unhealthy when a pipeline stall has outlasted --max-stall or nothing answers.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import { Device } from '../../dataplane/device/device.ts';
import { MemoryTun } from '../../dataplane/tun/memory-tun.ts';
import { MemoryNetwork } from '../../dataplane/bind/memory-bind.ts';
import { createUapiHandler } from '../../dataplane/uapi/uapi-device.ts';
import { startUapiServer, type UapiServer } from '../../dataplane/uapi/uapi-server.ts';
import { health, judgeHealth } from '../../bin/commands/health.ts';

let dir: string;
let device: Device;
let server: UapiServer;
/** What the device's stats say about the stall in progress (the test plays the watchdog). */
let stalledMs = 0;
const IFNAME = `rgh${process.pid % 100000}`;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'rg-health-'));
  device = new Device({ tun: new MemoryTun('rgmem0', 1420), bind: new MemoryNetwork().bind('192.0.2.1'), crypto: await selectCrypto() });
  await device.start(0);
  const real = device.stats.bind(device);
  device.stats = () => ({ ...real(), pipelineStalls: stalledMs > 0 ? 1 : 0, pipelineStalledMs: stalledMs });
  server = await startUapiServer(IFNAME, createUapiHandler(device), { dir });
});
after(async () => {
  await server?.close();
  await device?.close();
  rmSync(dir, { recursive: true, force: true });
});

async function probe(...args: string[]): Promise<number> {
  const saved = process.env.WG_SOCKET_DIR;
  process.env.WG_SOCKET_DIR = dir;
  try {
    return await health.run(args);
  } finally {
    if (saved === undefined) delete process.env.WG_SOCKET_DIR;
    else process.env.WG_SOCKET_DIR = saved;
  }
}

describe('roamguard health', () => {
  test('a data plane that answers and is not stalled is healthy (exit 0)', async () => {
    stalledMs = 0;
    assert.equal(device.stats().pipelineStalledMs, 0);
    assert.equal(await probe(IFNAME), 0);
  });

  test('a stall still within --max-stall (the watchdog is recovering it) is healthy', async () => {
    stalledMs = 3000;
    assert.equal(await probe('--max-stall', '10', IFNAME), 0);
  });

  test('a stall that outlasted --max-stall fails the probe (exit 1)', async () => {
    stalledMs = 12_000;
    assert.equal(await probe('--max-stall', '10', IFNAME), 1);
    assert.equal(await probe('--max-stall', '20', IFNAME), 0);
    const verdict = judgeHealth(device.stats(), 10_000);
    assert.equal(verdict.healthy, false);
    assert.match(verdict.message, /stalled for 12\.0 s \(pipeline_stalls=1 /);
  });

  test('nothing answering fails the probe; a data plane without counters (wireguard-go) is judged by its answer', async () => {
    assert.equal(await probe('rgh-none'), 1);
    assert.equal(judgeHealth(undefined, 10_000).healthy, true);
  });

  test('usage errors exit 2', async () => {
    assert.equal(await probe('--max-stall', '0', IFNAME), 2);
    assert.equal(await probe('--bogus'), 2);
    assert.equal(await probe('a', 'b'), 2);
  });
});
