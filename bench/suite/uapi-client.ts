/**
 * Timed control-socket operations for the scale run, on top of the data plane's UAPI client:
 * one operation per connection, as `wg` does, timed from connect to the last byte of the answer.
 */
import { UapiClient } from '../../dataplane/uapi/uapi-client.ts';
import { parseGetResponse, type DeviceSnapshot, type SetRequest } from '../../dataplane/uapi/uapi-protocol.ts';

export { isCompleteAnswer } from '../../dataplane/uapi/uapi-client.ts';

const TIMEOUT_MS = 30_000;

/** `get=1`: the device, the answer's size and the round-trip time. */
export async function uapiGet(socketPath: string): Promise<{ snapshot: DeviceSnapshot; ms: number; bytes: number }> {
  const started = performance.now();
  const text = await new UapiClient(socketPath, TIMEOUT_MS).exchange('get=1\n\n');
  const ms = performance.now() - started;
  const parsed = parseGetResponse(text);
  if (!parsed.ok) throw new Error(`get=1: ${parsed.message}`);
  return { snapshot: parsed.snapshot, ms, bytes: Buffer.byteLength(text) };
}

/** `set=1` with `request`; throws on a non-zero errno. Returns the round-trip time. */
export async function uapiSet(socketPath: string, request: SetRequest): Promise<number> {
  const started = performance.now();
  await new UapiClient(socketPath, TIMEOUT_MS).set(request);
  return performance.now() - started;
}
