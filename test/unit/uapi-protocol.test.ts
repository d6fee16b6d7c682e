/**
 * The UAPI text protocol without I/O: every `set` key, every rejection with its errno, the
 * empty-line quirk, and the exact `get` answer (order, formats, absolute handshake times).
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import { formatPrefix, parsePrefix, type Prefix } from '../../dataplane/net/ip.ts';
import {
  UAPI_ERRNO, formatErrno, formatGetResponse, formatSetRequest, parseGetResponse, parseSetRequest,
  type DeviceSnapshot, type SetRequest,
  type SnapshotInterning,
} from '../../dataplane/uapi/uapi-protocol.ts';

const hex = (byte: number) => byte.toString(16).padStart(2, '0').repeat(32);
const key = (byte: number) => new Uint8Array(32).fill(byte);
const K1 = hex(0x11), K2 = hex(0x22), K3 = hex(0xa3);

function parseOk(text: string): SetRequest {
  const result = parseSetRequest(text);
  if (!result.ok) assert.fail(`expected ${JSON.stringify(text)} to parse, got errno ${result.errno}: ${result.message}`);
  return result.request;
}

function parseErrno(text: string): number {
  const result = parseSetRequest(text);
  if (result.ok) assert.fail(`expected ${JSON.stringify(text)} to be rejected`);
  return result.errno;
}

describe('parseSetRequest: device keys', () => {
  test('private key, listen port, fwmark, replace_peers', () => {
    const r = parseOk(`private_key=${K1}\nlisten_port=51820\nfwmark=4294967295\nreplace_peers=true\n\n`);
    assert.deepEqual(r.privateKey, key(0x11));
    assert.equal(r.listenPort, 51820);
    assert.equal(r.fwmark, 0xffffffff);
    assert.equal(r.replacePeers, true);
    assert.deepEqual(r.peers, []);
  });

  test('absent keys stay absent; zeros are values', () => {
    const empty = parseOk('\n');
    assert.deepEqual(empty, { replacePeers: false, peers: [] });
    const zeros = parseOk(`private_key=${hex(0)}\nlisten_port=0\nfwmark=0\n\n`);
    assert.deepEqual(zeros.privateKey, key(0), 'an all-zero private key means "clear it"');
    assert.equal(zeros.listenPort, 0);
    assert.equal(zeros.fwmark, 0);
  });

  test('upper-case hex and leading zeros are accepted; the last of repeated keys wins', () => {
    const r = parseOk(`private_key=${K3.toUpperCase()}\nlisten_port=00080\nlisten_port=81\n\n`);
    assert.deepEqual(r.privateKey, key(0xa3));
    assert.equal(r.listenPort, 81);
  });

  test('values may contain "="; the key is what precedes the first one', () => {
    assert.equal(parseErrno('listen_port=1=2\n\n'), UAPI_ERRNO.EINVAL);
  });
});

describe('parseSetRequest: peer keys', () => {
  test('every peer key', () => {
    const r = parseOk([
      `public_key=${K1}`,
      'update_only=true',
      `preshared_key=${K2}`,
      'endpoint=192.0.2.7:51820',
      'persistent_keepalive_interval=25',
      'replace_allowed_ips=true',
      'allowed_ip=10.0.0.0/24',
      'allowed_ip=fd00::/64',
      'allowed_ip=-10.9.0.0/16',
      'protocol_version=1',
      `public_key=${K2}`,
      'remove=true',
      '', '',
    ].join('\n'));
    assert.equal(r.peers.length, 2);
    const [a, b] = r.peers;
    assert.deepEqual(a.publicKey, key(0x11));
    assert.equal(a.updateOnly, true);
    assert.equal(a.remove, false);
    assert.deepEqual(a.presharedKey, key(0x22));
    assert.equal(a.endpoint?.toString(), '192.0.2.7:51820');
    assert.equal(a.persistentKeepalive, 25);
    assert.equal(a.replaceAllowedIps, true);
    assert.deepEqual(a.allowedIps.map((c) => `${c.remove ? '-' : '+'}${formatPrefix(c.prefix)}`),
      ['+10.0.0.0/24', '+fd00::/64', '-10.9.0.0/16']);
    assert.deepEqual(b.publicKey, key(0x22));
    assert.equal(b.remove, true);
    assert.equal(b.updateOnly, false);
    assert.equal(b.replaceAllowedIps, false);
    assert.deepEqual(b.allowedIps, []);
  });

  test('endpoints: IPv4, IPv6 in brackets (canonicalized), IPv4-mapped', () => {
    const ep = (text: string) => parseOk(`public_key=${K1}\nendpoint=${text}\n\n`).peers[0].endpoint;
    assert.equal(ep('198.51.100.1:1')?.toString(), '198.51.100.1:1');
    const v6 = ep('[FD00:0:0::1]:51820');
    assert.equal(v6?.family, 6);
    assert.equal(v6?.toString(), '[fd00::1]:51820');
    assert.equal(ep('[::ffff:192.0.2.1]:9')?.toString(), '[::ffff:192.0.2.1]:9');
    assert.equal(ep('[2001:db8::]:65535')?.port, 65535);
  });

  test('allowed_ip prefixes are masked; "-" marks a removal', () => {
    const r = parseOk(`public_key=${K1}\nallowed_ip=10.1.2.3/8\nallowed_ip=-fd00::1:2/112\nallowed_ip=0.0.0.0/0\n\n`);
    assert.deepEqual(r.peers[0].allowedIps.map((c) => [formatPrefix(c.prefix), c.remove]),
      [['10.0.0.0/8', false], ['fd00::1:0/112', true], ['0.0.0.0/0', false]]);
  });

  test('replace_allowed_ips after some allowed_ip lines keeps their net effect', () => {
    const r = parseOk(`public_key=${K1}\nallowed_ip=10.0.0.1/32\nallowed_ip=-10.0.0.2/32\nreplace_allowed_ips=true\nallowed_ip=10.0.0.3/32\n\n`);
    const peer = r.peers[0];
    assert.equal(peer.replaceAllowedIps, true);
    // 10.0.0.1 was taken from its previous owner, then cleared: add then remove; the removal of
    // 10.0.0.2 is moot after clearing.
    assert.deepEqual(peer.allowedIps.map((c) => [formatPrefix(c.prefix), c.remove]),
      [['10.0.0.1/32', false], ['10.0.0.1/32', true], ['10.0.0.3/32', false]]);
  });

  test('several sections, also for the same key, stay in order', () => {
    const r = parseOk(`public_key=${K1}\nallowed_ip=10.0.0.1/32\npublic_key=${K2}\npublic_key=${K1}\nremove=true\n\n`);
    assert.deepEqual(r.peers.map((p) => [p.publicKey[0], p.remove]), [[0x11, false], [0x22, false], [0x11, true]]);
  });

  test('persistent keepalive bounds', () => {
    assert.equal(parseOk(`public_key=${K1}\npersistent_keepalive_interval=0\n\n`).peers[0].persistentKeepalive, 0);
    assert.equal(parseOk(`public_key=${K1}\npersistent_keepalive_interval=65535\n\n`).peers[0].persistentKeepalive, 65535);
  });
});

describe('parseSetRequest: empty lines and framing', () => {
  test('the first empty line ends the request; what follows is not part of it', () => {
    const quirk = parseSetRequest(`\nprivate_key=${K1}\n\n`);
    assert.ok(quirk.ok);
    assert.deepEqual(quirk.request, { replacePeers: false, peers: [] }, 'a leading empty line makes an empty set');
    assert.equal(quirk.consumedLines, 1);

    const mid = parseSetRequest(`listen_port=1\n\nlisten_port=2\n\n`);
    assert.ok(mid.ok);
    assert.equal(mid.request.listenPort, 1);
    assert.equal(mid.consumedLines, 2);
  });

  test('an array of lines (as the server passes them) needs no terminator', () => {
    const r = parseSetRequest(['listen_port=7', `public_key=${K1}`]);
    assert.ok(r.ok);
    assert.equal(r.request.listenPort, 7);
    assert.equal(r.consumedLines, 2);
  });
});

describe('parseSetRequest: rejections and their errno', () => {
  const P = `public_key=${K1}\n`;
  const cases: Array<[string, string, number]> = [
    ['device line without "="', 'private_key\n\n', UAPI_ERRNO.EPROTO],
    ['peer line without "="', `${P}allowed_ip 10.0.0.0/8\n\n`, UAPI_ERRNO.EPROTO],
    ['line of spaces', '   \n\n', UAPI_ERRNO.EPROTO],
    ['unknown device key', 'listenport=1\n\n', UAPI_ERRNO.EINVAL],
    ['empty key', '=1\n\n', UAPI_ERRNO.EINVAL],
    ['key case matters', 'Private_Key=00\n\n', UAPI_ERRNO.EINVAL],
    ['unknown peer key', `${P}allowed_ips=10.0.0.0/8\n\n`, UAPI_ERRNO.EINVAL],
    ['private_key after the first peer', `${P}private_key=${K2}\n\n`, UAPI_ERRNO.EINVAL],
    ['listen_port after the first peer', `${P}listen_port=1\n\n`, UAPI_ERRNO.EINVAL],
    ['fwmark after the first peer', `${P}fwmark=1\n\n`, UAPI_ERRNO.EINVAL],
    ['replace_peers after the first peer', `${P}replace_peers=true\n\n`, UAPI_ERRNO.EINVAL],
    ['peer key before any public_key', 'endpoint=1.2.3.4:5\n\n', UAPI_ERRNO.EINVAL],
    ['protocol_version as a device key', 'protocol_version=1\n\n', UAPI_ERRNO.EINVAL],
    ['private key: 63 hex digits', `private_key=${K1.slice(1)}\n\n`, UAPI_ERRNO.EINVAL],
    ['private key: 65 hex digits', `private_key=${K1}0\n\n`, UAPI_ERRNO.EINVAL],
    ['private key: not hex', `private_key=${'g'.repeat(64)}\n\n`, UAPI_ERRNO.EINVAL],
    ['private key: base64', 'private_key=EREREREREREREREREREREREREREREREREREREREREQ=\n\n', UAPI_ERRNO.EINVAL],
    ['public key: empty', 'public_key=\n\n', UAPI_ERRNO.EINVAL],
    ['preshared key: short', `${P}preshared_key=00\n\n`, UAPI_ERRNO.EINVAL],
    ['listen_port 65536', 'listen_port=65536\n\n', UAPI_ERRNO.EINVAL],
    ['listen_port negative', 'listen_port=-1\n\n', UAPI_ERRNO.EINVAL],
    ['listen_port with sign', 'listen_port=+1\n\n', UAPI_ERRNO.EINVAL],
    ['listen_port empty', 'listen_port=\n\n', UAPI_ERRNO.EINVAL],
    ['listen_port with space', 'listen_port= 1\n\n', UAPI_ERRNO.EINVAL],
    ['listen_port hex', 'listen_port=0x10\n\n', UAPI_ERRNO.EINVAL],
    ['fwmark 2^32', 'fwmark=4294967296\n\n', UAPI_ERRNO.EINVAL],
    ['replace_peers=false', 'replace_peers=false\n\n', UAPI_ERRNO.EINVAL],
    ['replace_peers=TRUE', 'replace_peers=TRUE\n\n', UAPI_ERRNO.EINVAL],
    ['replace_peers=1', 'replace_peers=1\n\n', UAPI_ERRNO.EINVAL],
    ['update_only=false', `${P}update_only=false\n\n`, UAPI_ERRNO.EINVAL],
    ['remove=yes', `${P}remove=yes\n\n`, UAPI_ERRNO.EINVAL],
    ['replace_allowed_ips empty', `${P}replace_allowed_ips=\n\n`, UAPI_ERRNO.EINVAL],
    ['protocol_version=2', `${P}protocol_version=2\n\n`, UAPI_ERRNO.EINVAL],
    ['protocol_version=0', `${P}protocol_version=0\n\n`, UAPI_ERRNO.EINVAL],
    ['persistent keepalive 65536', `${P}persistent_keepalive_interval=65536\n\n`, UAPI_ERRNO.EINVAL],
    ['persistent keepalive text', `${P}persistent_keepalive_interval=off\n\n`, UAPI_ERRNO.EINVAL],
    ['endpoint: host name', `${P}endpoint=example.com:51820\n\n`, UAPI_ERRNO.EINVAL],
    ['endpoint: no port', `${P}endpoint=192.0.2.1\n\n`, UAPI_ERRNO.EINVAL],
    ['endpoint: port 65536', `${P}endpoint=192.0.2.1:65536\n\n`, UAPI_ERRNO.EINVAL],
    ['endpoint: IPv6 without brackets', `${P}endpoint=fd00::1:51820\n\n`, UAPI_ERRNO.EINVAL],
    ['endpoint: IPv6 zone', `${P}endpoint=[fe80::1%eth0]:51820\n\n`, UAPI_ERRNO.EINVAL],
    ['endpoint: empty', `${P}endpoint=\n\n`, UAPI_ERRNO.EINVAL],
    ['allowed_ip without length', `${P}allowed_ip=10.0.0.1\n\n`, UAPI_ERRNO.EINVAL],
    ['allowed_ip /33', `${P}allowed_ip=10.0.0.0/33\n\n`, UAPI_ERRNO.EINVAL],
    ['allowed_ip /129', `${P}allowed_ip=fd00::/129\n\n`, UAPI_ERRNO.EINVAL],
    ['allowed_ip IPv4 shorthand', `${P}allowed_ip=10/8\n\n`, UAPI_ERRNO.EINVAL],
    ['allowed_ip lone "-"', `${P}allowed_ip=-\n\n`, UAPI_ERRNO.EINVAL],
    ['allowed_ip "--"', `${P}allowed_ip=--10.0.0.0/8\n\n`, UAPI_ERRNO.EINVAL],
    ['allowed_ip empty', `${P}allowed_ip=\n\n`, UAPI_ERRNO.EINVAL],
  ];
  for (const [name, text, errno] of cases) {
    test(`${name} → ${errno}`, () => {
      assert.equal(parseErrno(text), errno);
    });
  }

  test('the first bad line decides the errno, and the message names it', () => {
    const r = parseSetRequest(`listen_port=1\nbogus=1\nno-equals-sign\n\n`);
    assert.ok(!r.ok);
    assert.equal(r.errno, UAPI_ERRNO.EINVAL);
    assert.match(r.message, /line 2/);
    assert.match(r.message, /bogus/);
    assert.equal(r.consumedLines, 2);
  });

  test('messages never echo a malformed key or a line without "=" (they could be secrets)', () => {
    const secret = 'c0ffee'.repeat(10) + 'abc';
    for (const text of [`private_key=${secret}\n\n`, `public_key=${K1}\npreshared_key=${secret}\n\n`, `${secret}\n\n`]) {
      const r = parseSetRequest(text);
      assert.ok(!r.ok);
      assert.ok(!r.message.includes('c0ffee'), r.message);
    }
  });

  test('a peer bound: one section too many → EMSGSIZE', () => {
    const text = [`public_key=${K1}`, `public_key=${K2}`, `public_key=${K3}`, '', ''].join('\n');
    assert.ok(parseSetRequest(text, { maxPeers: 3 }).ok);
    const r = parseSetRequest(text, { maxPeers: 2 });
    assert.ok(!r.ok);
    assert.equal(r.errno, UAPI_ERRNO.EMSGSIZE);
  });

  test('errno constants are the negative Linux values wireguard-go sends', () => {
    assert.deepEqual({ ...UAPI_ERRNO }, { EIO: -5, EPROTO: -71, EINVAL: -22, EADDRINUSE: -98, EMSGSIZE: -90, UNKNOWN: -55 });
    assert.equal(formatErrno(UAPI_ERRNO.EADDRINUSE), 'errno=-98\n\n');
    assert.equal(formatErrno(0), 'errno=0\n\n');
  });
});

describe('formatGetResponse', () => {
  const handshakeMs = Date.UTC(2026, 2, 4, 5, 6, 7) + 123.456;
  const snapshot: DeviceSnapshot = {
    privateKey: key(0x11),
    listenPort: 51820,
    fwmark: 51,
    peers: [
      {
        publicKey: key(0x22),
        presharedKey: key(0),
        endpoint: new Endpoint('192.0.2.7', 51821),
        lastHandshakeWallMs: handshakeMs,
        txBytes: 1234,
        rxBytes: 2 ** 40,
        persistentKeepalive: 25,
        allowedIps: [parsePrefix('10.0.0.2/32'), parsePrefix('fd00::/64')],
      },
      {
        publicKey: key(0xa3),
        presharedKey: key(0xff),
        lastHandshakeWallMs: 0,
        txBytes: 0,
        rxBytes: 0,
        persistentKeepalive: 0,
        allowedIps: [],
      },
    ],
  };

  test('device lines, then each peer in order, then errno=0 and an empty line', () => {
    assert.equal(formatGetResponse(snapshot), [
      `private_key=${K1}`,
      'listen_port=51820',
      'fwmark=51',
      `public_key=${K2}`,
      `preshared_key=${hex(0)}`,
      'protocol_version=1',
      'endpoint=192.0.2.7:51821',
      `last_handshake_time_sec=${Math.floor(handshakeMs / 1000)}`,
      'last_handshake_time_nsec=123456000',
      'tx_bytes=1234',
      'rx_bytes=1099511627776',
      'persistent_keepalive_interval=25',
      'allowed_ip=10.0.0.2/32',
      'allowed_ip=fd00::/64',
      `public_key=${K3}`,
      `preshared_key=${hex(0xff)}`,
      'protocol_version=1',
      'last_handshake_time_sec=0',
      'last_handshake_time_nsec=0',
      'tx_bytes=0',
      'rx_bytes=0',
      'persistent_keepalive_interval=0',
      'errno=0',
      '',
      '',
    ].join('\n'));
  });

  test('handshake time is absolute Unix time (not an age); 0 means never', () => {
    const text = formatGetResponse(snapshot);
    const sec = Number(/last_handshake_time_sec=(\d+)/.exec(text)![1]);
    assert.equal(sec, 1772600767, '2026-03-04T05:06:07Z');
    assert.ok(sec > 1_700_000_000, 'an epoch time, not seconds since the handshake');
  });

  test('unset / zero device fields are left out', () => {
    const bare = formatGetResponse({ privateKey: undefined, listenPort: 0, fwmark: 0, peers: [] });
    assert.equal(bare, 'errno=0\n\n');
    const zeroKey = formatGetResponse({ privateKey: key(0), listenPort: 0, fwmark: 0, peers: [] });
    assert.equal(zeroKey, 'errno=0\n\n');
  });

  test('IPv6 endpoints in brackets; keys in lower-case hex', () => {
    const text = formatGetResponse({
      listenPort: 0, fwmark: 0,
      peers: [{ ...snapshot.peers[1], publicKey: key(0xab), endpoint: Endpoint.parse('[FD00::A]:7') }],
    });
    assert.match(text, /^public_key=(ab){32}$/m);
    assert.match(text, /^endpoint=\[fd00::a\]:7$/m);
    assert.doesNotMatch(text, /[A-F]/);
  });

  test('no blank line before errno (it would make `wg show` fail)', () => {
    const text = formatGetResponse(snapshot);
    assert.ok(!text.slice(0, text.indexOf('errno=')).includes('\n\n'));
    assert.ok(text.endsWith('\nerrno=0\n\n'));
  });

  test('parseGetResponse reads it back', () => {
    const r = parseGetResponse(formatGetResponse(snapshot));
    assert.ok(r.ok);
    assert.deepEqual(r.snapshot.privateKey, snapshot.privateKey);
    assert.equal(r.snapshot.listenPort, 51820);
    assert.equal(r.snapshot.fwmark, 51);
    assert.equal(r.snapshot.peers.length, 2);
    const [a, b] = r.snapshot.peers;
    assert.ok(Math.abs(a.lastHandshakeWallMs - handshakeMs) < 1e-6);
    assert.equal(a.endpoint?.toString(), '192.0.2.7:51821');
    assert.equal(a.rxBytes, 2 ** 40);
    assert.deepEqual(a.allowedIps.map(formatPrefix), ['10.0.0.2/32', 'fd00::/64']);
    assert.deepEqual(b.presharedKey, key(0xff));
    assert.equal(b.endpoint, undefined);
  });

  test('parseGetResponse with interning: the same text gives the same prefix, a zero preshared key is the shared one, and what parses is unchanged', () => {
    const kept = new Map<string, Prefix>();
    const zeroKey = new Uint8Array(32);
    const interning: SnapshotInterning = { prefix: (text, parsed) => kept.get(text) ?? (kept.set(text, parsed), parsed), zeroKey };
    const text = formatGetResponse(snapshot);
    const first = parseGetResponse(text, interning);
    const second = parseGetResponse(text, interning);
    const plain = parseGetResponse(text);
    assert.ok(first.ok && second.ok && plain.ok);
    assert.deepEqual(first.snapshot, plain.snapshot, 'the same snapshot as without interning');
    assert.equal(first.snapshot.peers[0].allowedIps[1], second.snapshot.peers[0].allowedIps[1], 'one prefix object per text');
    const plainAgain = parseGetResponse(text);
    assert.ok(plainAgain.ok);
    assert.notEqual(plain.snapshot.peers[0].allowedIps[1], plainAgain.snapshot.peers[0].allowedIps[1], 'without it, each parse has its own');
    assert.equal(first.snapshot.peers[0].presharedKey, zeroKey, 'a peer without a preshared key gets the shared zero key');
    assert.notEqual(first.snapshot.peers[1].presharedKey, zeroKey, 'a real preshared key is its own');
    const bad = parseGetResponse(text.replace('allowed_ip=10.0.0.2/32', 'allowed_ip=10.0.0.2'), interning);
    assert.equal(bad.ok, false, 'a malformed prefix is still an error');
  });

  test('parseGetResponse: errors', () => {
    assert.deepEqual(parseGetResponse('errno=-22\n\n'), { ok: false, errno: -22, message: 'the device answered errno=-22' });
    const blank = parseGetResponse('listen_port=1\n\nerrno=0\n\n');
    assert.ok(!blank.ok && blank.errno === UAPI_ERRNO.EPROTO);
    const missing = parseGetResponse('listen_port=1\n');
    assert.ok(!missing.ok && missing.errno === UAPI_ERRNO.EPROTO);
    const unknown = parseGetResponse('own_public_key=00\nlisten_port=1\nerrno=0\n\n');
    assert.ok(unknown.ok && unknown.snapshot.listenPort === 1, 'unknown keys are ignored, as wg does');
  });
});

describe('formatSetRequest', () => {
  test('round trip through parseSetRequest', () => {
    const request: SetRequest = {
      privateKey: key(0x11), listenPort: 4242, fwmark: 7, replacePeers: true,
      peers: [
        {
          publicKey: key(0x22), remove: false, updateOnly: true, presharedKey: key(0x33),
          endpoint: Endpoint.parse('[2001:db8::1]:51820'), persistentKeepalive: 15, replaceAllowedIps: true,
          allowedIps: [{ prefix: parsePrefix('10.0.0.0/8'), remove: false }, { prefix: parsePrefix('fd00::/8'), remove: true }],
        },
        { publicKey: key(0x44), remove: true, updateOnly: false, replaceAllowedIps: false, allowedIps: [] },
      ],
    };
    const text = formatSetRequest(request);
    assert.ok(text.startsWith('set=1\n'));
    assert.ok(text.endsWith('\n\n'));
    const parsed = parseSetRequest(text.slice('set=1\n'.length));
    assert.ok(parsed.ok);
    assert.deepEqual(parsed.request, request);
  });
});
